// A float64 reference forward pass of a Llama-family Hugging Face model (llama, mistral, qwen2,
// qwen3), written from the Hugging Face modeling code's definitions and nothing else: one token
// at a time, a plain per-layer list of rotated keys and values, no SIMD, every sum in double
// precision. Slow, which is fine for the tiny models the architecture tests make; it gives those
// tests a ground truth to measure both Troupe's and llama.cpp's logit error against.
//
// Usage: node llama_reference.mjs REQUEST.json
//   REQUEST: {"runs": [{"model": HF_DIR, "prompt_ids": [...], "forced_ids": [...]}, ...]}
//   HF_DIR holds config.json and one model.safetensors (F32, F16 or BF16 tensors). Each run
//   teacher-forces forced_ids after the prompt: logits are computed after the prompt and after
//   each forced token but the last (one step per forced id). Nothing is added to the prompt.
//   A run with "hidden_states": true instead reports, for every prompt token, the final hidden
//   state (after the last norm: Hugging Face's last_hidden_state), which embeddings pool.
//
// Prints one JSON line per run, in order: {"logits": [[vocab floats] per step]}, or
// {"hidden": [[hidden_size floats] per prompt token]}.
// Exit status 0 on success; on failure an error message on stderr and status 1.

import { readFileSync } from "node:fs";
import { join } from "node:path";

function half_to_double(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const mantissa = bits & 0x3ff;
  if (exponent === 0) return sign * mantissa * 2 ** -24;
  if (exponent === 31) return mantissa ? NaN : sign * Infinity;
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}

// Every tensor of a single-file safetensors checkpoint as Float64Array, by name.
function load_safetensors(path) {
  const file = readFileSync(path);
  const header_size = Number(file.readBigUInt64LE(0));
  const header = JSON.parse(file.subarray(8, 8 + header_size).toString("utf8"));
  const base = 8 + header_size;
  const tensors = new Map();
  for (const [name, info] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const [begin, end] = info.data_offsets;
    const bytes = file.subarray(base + begin, base + end);
    const count = info.shape.reduce((a, b) => a * b, 1);
    const values = new Float64Array(count);
    for (let i = 0; i < count; ++i) {
      if (info.dtype === "F32") values[i] = bytes.readFloatLE(4 * i);
      else if (info.dtype === "F16") values[i] = half_to_double(bytes.readUInt16LE(2 * i));
      else if (info.dtype === "BF16") {
        const word = Buffer.alloc(4);
        word.writeUInt16LE(bytes.readUInt16LE(2 * i), 2);
        values[i] = word.readFloatLE(0);
      } else throw new Error(`${path}: tensor ${name} has dtype ${info.dtype}; expected F32, F16 or BF16`);
    }
    tensors.set(name, { shape: info.shape, values });
  }
  return tensors;
}

// y[rows] = W[rows, cols] · x[cols] (+ bias)
function linear(weight, x, bias) {
  const [rows, cols] = weight.shape;
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; ++r) {
    let sum = 0;
    const row = r * cols;
    for (let c = 0; c < cols; ++c) sum += weight.values[row + c] * x[c];
    y[r] = bias ? sum + bias.values[r] : sum;
  }
  return y;
}

function rms_norm(x, weight, eps, offset = 0, size = x.length) {
  let sum = 0;
  for (let i = 0; i < size; ++i) sum += x[offset + i] * x[offset + i];
  const scale = 1 / Math.sqrt(sum / size + eps);
  for (let i = 0; i < size; ++i) x[offset + i] = weight.values[i] * (x[offset + i] * scale);
}

// HF's rotary inverse frequencies, with the llama3 rope_scaling rule when configured.
function inverse_frequencies(config, head_dim) {
  const inv_freq = [];
  for (let i = 0; i < head_dim / 2; ++i) inv_freq.push(1 / config.rope_theta ** ((2 * i) / head_dim));
  const scaling = config.rope_scaling;
  if (!scaling) return inv_freq;
  const type = scaling.rope_type ?? scaling.type;
  if (type !== "llama3") throw new Error(`rope_scaling type '${type}' is not implemented here`);
  const original = scaling.original_max_position_embeddings;
  const low_wavelen = original / scaling.low_freq_factor;
  const high_wavelen = original / scaling.high_freq_factor;
  return inv_freq.map((freq) => {
    const wavelen = (2 * Math.PI) / freq;
    if (wavelen < high_wavelen) return freq;
    if (wavelen > low_wavelen) return freq / scaling.factor;
    const smooth = (original / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
    return (1 - smooth) * (freq / scaling.factor) + smooth * freq;
  });
}

// rotate_half form: pairs (i, i + half) of each head.
function rope(x, num_heads, head_dim, position, inv_freq) {
  const half = head_dim / 2;
  for (let h = 0; h < num_heads; ++h) {
    const o = h * head_dim;
    for (let i = 0; i < half; ++i) {
      const angle = position * inv_freq[i];
      const [c, s] = [Math.cos(angle), Math.sin(angle)];
      const [x1, x2] = [x[o + i], x[o + half + i]];
      x[o + i] = x1 * c - x2 * s;
      x[o + half + i] = x2 * c + x1 * s;
    }
  }
}

function silu(v) {
  return v / (1 + Math.exp(-v));
}

// A model with a growing cache of every layer's rotated keys and values: feeding a token
// returns the logits after it. Attention is recomputed exactly, token by token, in float64.
class reference_model {
  constructor(dir) {
    this.config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"));
    this.tensors = load_safetensors(join(dir, "model.safetensors"));
    const c = this.config;
    this.hidden = c.hidden_size;
    this.num_heads = c.num_attention_heads;
    this.num_kv_heads = c.num_key_value_heads ?? this.num_heads;
    this.head_dim = c.head_dim ?? this.hidden / this.num_heads;
    this.inv_freq = inverse_frequencies(c, this.head_dim);
    this.reset();
  }

  reset() {
    this.keys = Array.from({ length: this.config.num_hidden_layers }, () => []);
    this.values = Array.from({ length: this.config.num_hidden_layers }, () => []);
  }

  tensor(name) {
    return this.tensors.get(name);
  }

  feed(token) {
    const { hidden, num_heads, num_kv_heads, head_dim } = this;
    const eps = this.config.rms_norm_eps;
    const group = num_heads / num_kv_heads;
    const position = this.keys[0].length;
    const embed = this.tensor("model.embed_tokens.weight");
    if (token < 0 || token >= embed.shape[0]) throw new Error(`token id ${token} is outside the vocabulary`);
    const x = embed.values.slice(token * hidden, (token + 1) * hidden);
    for (let l = 0; l < this.config.num_hidden_layers; ++l) {
      const p = `model.layers.${l}.`;
      const h = Float64Array.from(x);
      rms_norm(h, this.tensor(p + "input_layernorm.weight"), eps);
      const q = linear(this.tensor(p + "self_attn.q_proj.weight"), h, this.tensor(p + "self_attn.q_proj.bias"));
      const k = linear(this.tensor(p + "self_attn.k_proj.weight"), h, this.tensor(p + "self_attn.k_proj.bias"));
      const v = linear(this.tensor(p + "self_attn.v_proj.weight"), h, this.tensor(p + "self_attn.v_proj.bias"));
      if (this.tensor(p + "self_attn.q_norm.weight")) {
        for (let hd = 0; hd < num_heads; ++hd) rms_norm(q, this.tensor(p + "self_attn.q_norm.weight"), eps, hd * head_dim, head_dim);
        for (let hd = 0; hd < num_kv_heads; ++hd) rms_norm(k, this.tensor(p + "self_attn.k_norm.weight"), eps, hd * head_dim, head_dim);
      }
      rope(q, num_heads, head_dim, position, this.inv_freq);
      rope(k, num_kv_heads, head_dim, position, this.inv_freq);
      this.keys[l].push(k);
      this.values[l].push(v);
      const ks = this.keys[l], vs = this.values[l];

      const attended = new Float64Array(num_heads * head_dim);
      for (let hd = 0; hd < num_heads; ++hd) {
        const kv = Math.floor(hd / group);
        const scores = ks.map((key) => {
          let dot = 0;
          for (let i = 0; i < head_dim; ++i) dot += q[hd * head_dim + i] * key[kv * head_dim + i];
          return dot / Math.sqrt(head_dim);
        });
        const top = Math.max(...scores);
        const weights = scores.map((score) => Math.exp(score - top));
        const total = weights.reduce((a, b) => a + b, 0);
        for (let s = 0; s < vs.length; ++s) {
          for (let i = 0; i < head_dim; ++i) attended[hd * head_dim + i] += (weights[s] / total) * vs[s][kv * head_dim + i];
        }
      }
      const o = linear(this.tensor(p + "self_attn.o_proj.weight"), attended);
      for (let i = 0; i < hidden; ++i) x[i] += o[i];
      const g = Float64Array.from(x);
      rms_norm(g, this.tensor(p + "post_attention_layernorm.weight"), eps);
      const gate = linear(this.tensor(p + "mlp.gate_proj.weight"), g);
      const up = linear(this.tensor(p + "mlp.up_proj.weight"), g);
      for (let i = 0; i < gate.length; ++i) gate[i] = silu(gate[i]) * up[i];
      const down = linear(this.tensor(p + "mlp.down_proj.weight"), gate);
      for (let i = 0; i < hidden; ++i) x[i] += down[i];
    }
    rms_norm(x, this.tensor("model.norm.weight"), eps);
    this.last_hidden = x;
    return linear(this.tensor("lm_head.weight") ?? embed, x);
  }
}

function main() {
  if (process.argv.length !== 3) throw new Error("usage: node llama_reference.mjs REQUEST.json");
  const request = JSON.parse(readFileSync(process.argv[2], "utf8"));
  const models = new Map();
  for (const run of request.runs) {
    if (!models.has(run.model)) models.set(run.model, new reference_model(run.model));
    const model = models.get(run.model);
    if (!run.prompt_ids || run.prompt_ids.length === 0) throw new Error("a run needs prompt_ids");
    model.reset();
    if (run.hidden_states) {
      const hidden = [];
      for (const id of run.prompt_ids) {
        model.feed(id);
        hidden.push(Array.from(model.last_hidden, (v) => Number(v.toPrecision(12))));
      }
      process.stdout.write(JSON.stringify({ hidden }) + "\n");
      continue;
    }
    let logits;
    for (const id of run.prompt_ids) logits = model.feed(id);
    const steps = [];
    for (let s = 0; s < run.forced_ids.length; ++s) {
      steps.push(Array.from(logits, (v) => Number(v.toPrecision(9))));
      if (s + 1 < run.forced_ids.length) logits = model.feed(run.forced_ids[s]);
    }
    process.stdout.write(JSON.stringify({ logits: steps }) + "\n");
  }
}

try {
  main();
} catch (error) {
  process.stderr.write(`llama_reference: ${error && error.message ? error.message : error}\n`);
  process.exit(1);
}
