// A float64 reference forward pass of a Hugging Face decoder (llama, mistral, qwen2, qwen3,
// mixtral, qwen2_moe, qwen3_moe, gpt_oss, gemma2, gemma3, phi3), written from the Hugging Face
// modeling code's definitions and nothing else, reading each checkpoint's own tensor forms
// (Phi-3's fused qkv and gate_up, gpt-oss's packed experts, Gemma's 1 + w norms): one token
// at a time, a plain per-layer list of rotated keys and values, no SIMD, every sum in double
// precision. Slow, which is fine for the tiny models the architecture tests make; it gives those
// tests a ground truth to measure both Troupe's and llama.cpp's logit error against.
//
// Usage: node llama_reference.mjs REQUEST.json
//   REQUEST: {"runs": [{"model": HF_DIR, "prompt_ids": [...], "forced_ids": [...], "prompt_logits": bool}, ...]}
//   HF_DIR holds config.json and one model.safetensors (F32, F16 or BF16 tensors). Each run
//   teacher-forces forced_ids after the prompt: logits are computed after the prompt and after
//   each forced token but the last (one step per forced id). Nothing is added to the prompt.
//   A run with "hidden_states": true instead reports, for every prompt token, the final hidden
//   state (after the last norm: Hugging Face's last_hidden_state), which embeddings pool.
//
// Prints one JSON line per run, in order: {"logits": [[vocab floats] per step]}, with
// "prompt_logits": [[vocab floats] after each prompt position but the last] when asked; or
// {"hidden": [[hidden_size floats] per prompt token]} for a hidden_states run.
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

// Each layer's rotary parameters as transformers' modeling_rope_utils defines them: the inverse
// frequencies of the rotary dimensions and the factor cos and sin are scaled by.
//   linear: inv_freq / factor.   dynamic: the base at factor x the original context, statically
//   (vLLM's form; transformers grows it only once a sequence passes the original context).
//   llama3: three wavelength bands.   yarn: interpolation ramped between the beta_fast and
//   beta_slow correction dimensions, attention factor 0.1 ln(factor) + 1 unless given.
//   longrope: per-frequency divisors, long ones when max_position_embeddings exceeds the
//   original context (llama.cpp's rule by context size; transformers switches by sequence length).
// Gemma 3's sliding layers turn by rope_local_base_freq, unscaled.
function rope_parameters(config, rotary_dims, sliding) {
  const plain = (base) => Array.from({ length: rotary_dims / 2 }, (_, i) => 1 / base ** ((2 * i) / rotary_dims));
  if (sliding && config.rope_local_base_freq) return { inv_freq: plain(config.rope_local_base_freq), attention_factor: 1 };
  const scaling = config.rope_scaling;
  const base = config.rope_theta;
  if (!scaling) return { inv_freq: plain(base), attention_factor: 1 };
  const type = scaling.rope_type ?? scaling.type;
  const factor = scaling.factor ?? 1;
  const original = scaling.original_max_position_embeddings ?? config.original_max_position_embeddings ?? config.max_position_embeddings;
  if (type === "linear") return { inv_freq: plain(base).map((f) => f / factor), attention_factor: 1 };
  if (type === "dynamic") {
    const grown = base * (factor * factor - (factor - 1)) ** (rotary_dims / (rotary_dims - 2));
    return { inv_freq: plain(grown), attention_factor: 1 };
  }
  if (type === "llama3") {
    const low_wavelen = original / scaling.low_freq_factor;
    const high_wavelen = original / scaling.high_freq_factor;
    const inv_freq = plain(base).map((freq) => {
      const wavelen = (2 * Math.PI) / freq;
      if (wavelen < high_wavelen) return freq;
      if (wavelen > low_wavelen) return freq / factor;
      const smooth = (original / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
      return (1 - smooth) * (freq / factor) + smooth * freq;
    });
    return { inv_freq, attention_factor: 1 };
  }
  if (type === "yarn") {
    const correction_dim = (rotations) => (rotary_dims * Math.log(original / (rotations * 2 * Math.PI))) / (2 * Math.log(base));
    let low = correction_dim(scaling.beta_fast ?? 32);
    let high = correction_dim(scaling.beta_slow ?? 1);
    if (scaling.truncate ?? true) {
      low = Math.floor(low);
      high = Math.ceil(high);
    }
    low = Math.max(low, 0);
    high = Math.min(high, rotary_dims - 1);
    if (low === high) high += 0.001;
    const inv_freq = plain(base).map((extrapolated, i) => {
      const keep = 1 - Math.min(1, Math.max(0, (i - low) / (high - low)));
      return (extrapolated / factor) * (1 - keep) + extrapolated * keep;
    });
    const mscale = (scale, m) => (scale <= 1 ? 1 : 0.1 * m * Math.log(scale) + 1);
    let attention_factor = scaling.attention_factor;
    if (attention_factor == null) {
      attention_factor = scaling.mscale && scaling.mscale_all_dim ? mscale(factor, scaling.mscale) / mscale(factor, scaling.mscale_all_dim) : mscale(factor, 1);
    }
    return { inv_freq, attention_factor };
  }
  if (type === "longrope" || type === "su") {
    const divisors = config.max_position_embeddings > original ? scaling.long_factor : scaling.short_factor;
    const inv_freq = plain(base).map((f, i) => f / divisors[i]);
    let attention_factor = scaling.attention_factor;
    if (attention_factor == null) {
      const scale = config.max_position_embeddings / original;
      attention_factor = scale <= 1 ? 1 : Math.sqrt(1 + Math.log(scale) / Math.log(original));
    }
    return { inv_freq, attention_factor };
  }
  throw new Error(`rope_scaling type '${type}' is not implemented here`);
}

// rotate_half form over the first 2 * inv_freq.length dimensions of each head.
function rope(x, num_heads, head_dim, position, rotary) {
  const half = rotary.inv_freq.length;
  for (let h = 0; h < num_heads; ++h) {
    const o = h * head_dim;
    for (let i = 0; i < half; ++i) {
      const angle = position * rotary.inv_freq[i];
      const [c, s] = [Math.cos(angle) * rotary.attention_factor, Math.sin(angle) * rotary.attention_factor];
      const [x1, x2] = [x[o + i], x[o + half + i]];
      x[o + i] = x1 * c - x2 * s;
      x[o + half + i] = x2 * c + x1 * s;
    }
  }
}

function silu(v) {
  return v / (1 + Math.exp(-v));
}

// transformers' gelu_pytorch_tanh.
function gelu_tanh(v) {
  return 0.5 * v * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (v + 0.044715 * v * v * v)));
}

function sigmoid(v) {
  return 1 / (1 + Math.exp(-v));
}

// Each family's differences from Llama, as the HF modeling files define them.
function family_of(config) {
  const arch = config.architectures[0];
  const families = {
    LlamaForCausalLM: {}, MistralForCausalLM: {}, Qwen2ForCausalLM: {}, Qwen3ForCausalLM: { qk_norm: true },
    MixtralForCausalLM: { moe: "mixtral" },
    Qwen2MoeForCausalLM: { moe: "qwen" },
    Qwen3MoeForCausalLM: { moe: "qwen", qk_norm: true },
    GptOssForCausalLM: { moe: "gpt_oss" },
    Gemma2ForCausalLM: { gemma: true },
    Gemma3ForCausalLM: { gemma: true, qk_norm: true },
    Phi3ForCausalLM: { fused: true },
  };
  if (!(arch in families)) throw new Error(`architecture '${arch}' is not implemented here`);
  return families[arch];
}

// A model with a growing cache of every layer's rotated keys and values: feeding a token
// returns the logits after it. Attention is recomputed exactly, token by token, in float64.
class reference_model {
  constructor(dir) {
    this.config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"));
    this.tensors = load_safetensors(join(dir, "model.safetensors"));
    const c = this.config;
    this.family = family_of(c);
    this.hidden = c.hidden_size;
    this.num_heads = c.num_attention_heads;
    this.num_kv_heads = c.num_key_value_heads ?? this.num_heads;
    this.head_dim = c.head_dim ?? this.hidden / this.num_heads;
    this.rotary_dims = Math.floor(this.head_dim * (c.partial_rotary_factor ?? 1));
    const layers = c.num_hidden_layers;
    this.sliding = Array.from({ length: layers }, (_, l) => {
      if (c.sliding_window == null) return false;
      if (c.layer_types) return c.layer_types[l] === "sliding_attention";
      const arch = c.architectures[0];
      if (arch === "Qwen2ForCausalLM" || arch === "Qwen3ForCausalLM" || arch.includes("Moe")) return !!c.use_sliding_window;
      return true;
    });
    this.rotary = this.sliding.map((sliding) => rope_parameters(c, this.rotary_dims, sliding));
    this.scale = 1 / Math.sqrt(c.query_pre_attn_scalar ?? this.head_dim);
    this.reset();
  }

  reset() {
    this.keys = Array.from({ length: this.config.num_hidden_layers }, () => []);
    this.values = Array.from({ length: this.config.num_hidden_layers }, () => []);
  }

  tensor(name) {
    return this.tensors.get(name);
  }

  // RMSNorm in place; Gemma's weights are offsets from 1.
  norm(x, weight, offset = 0, size = x.length) {
    let sum = 0;
    for (let i = 0; i < size; ++i) sum += x[offset + i] * x[offset + i];
    const scale = 1 / Math.sqrt(sum / size + this.config.rms_norm_eps);
    const one = this.family.gemma ? 1 : 0;
    for (let i = 0; i < size; ++i) x[offset + i] = (one + weight.values[i]) * (x[offset + i] * scale);
  }

  // The q, k, v projections of a layer (Phi-3 fuses them).
  qkv(p, h) {
    const { num_heads, num_kv_heads, head_dim } = this;
    if (this.family.fused) {
      const all = linear(this.tensor(p + "self_attn.qkv_proj.weight"), h);
      const q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
      return [all.slice(0, q_size), all.slice(q_size, q_size + kv_size), all.slice(q_size + kv_size)];
    }
    return ["q", "k", "v"].map((n) => linear(this.tensor(`${p}self_attn.${n}_proj.weight`), h, this.tensor(`${p}self_attn.${n}_proj.bias`)));
  }

  // A gated MLP with weights [inter, hidden] gate and up, [hidden, inter] down.
  gated(x, gate_w, up_w, down_w) {
    const gate = linear(gate_w, x);
    const up = linear(up_w, x);
    const act = this.family.gemma ? gelu_tanh : silu;
    for (let i = 0; i < gate.length; ++i) gate[i] = act(gate[i]) * up[i];
    return linear(down_w, gate);
  }

  mlp(p, x) {
    if (this.family.fused) {  // Phi-3: gate_up_proj, gate first
      const gate_up = linear(this.tensor(p + "mlp.gate_up_proj.weight"), x);
      const inter = gate_up.length / 2;
      const h = new Float64Array(inter);
      for (let i = 0; i < inter; ++i) h[i] = silu(gate_up[i]) * gate_up[inter + i];
      return linear(this.tensor(p + "mlp.down_proj.weight"), h);
    }
    return this.gated(x, this.tensor(p + "mlp.gate_proj.weight"), this.tensor(p + "mlp.up_proj.weight"), this.tensor(p + "mlp.down_proj.weight"));
  }

  // The top-k experts of a softmax router and their weights (renormalised when asked).
  static softmax_top_k(logits, k, renormalise) {
    const top = Math.max(...logits);
    const exp = Array.from(logits, (v) => Math.exp(v - top));
    const total = exp.reduce((a, b) => a + b, 0);
    const probs = exp.map((v) => v / total);
    const order = probs.map((_, i) => i).sort((a, b) => probs[b] - probs[a] || a - b).slice(0, k);
    let weights = order.map((e) => probs[e]);
    if (renormalise) {
      const sum = weights.reduce((a, b) => a + b, 0);
      weights = weights.map((w) => w / sum);
    }
    return [order, weights];
  }

  moe(p, x) {
    const c = this.config;
    const out = new Float64Array(this.hidden);
    if (this.family.moe === "gpt_oss") {  // top-k of the biased logits, softmax over those k
      const logits = linear(this.tensor(p + "mlp.router.weight"), x, this.tensor(p + "mlp.router.bias"));
      const k = c.num_experts_per_tok ?? c.experts_per_token;
      const order = Array.from(logits, (_, i) => i).sort((a, b) => logits[b] - logits[a] || a - b).slice(0, k);
      const top = logits[order[0]];
      const exp = order.map((e) => Math.exp(logits[e] - top));
      const total = exp.reduce((a, b) => a + b, 0);
      const gate_up = this.tensor(p + "mlp.experts.gate_up_proj");  // [E, hidden, 2 * inter]
      const gate_up_bias = this.tensor(p + "mlp.experts.gate_up_proj_bias");  // [E, 2 * inter]
      const down = this.tensor(p + "mlp.experts.down_proj");  // [E, inter, hidden]
      const down_bias = this.tensor(p + "mlp.experts.down_proj_bias");  // [E, hidden]
      const [, hidden, two_inter] = gate_up.shape;
      const inter = two_inter / 2, limit = c.swiglu_limit ?? 7, alpha = 1.702;
      order.forEach((e, j) => {
        const glu = new Float64Array(inter);
        for (let i = 0; i < inter; ++i) {
          let g = gate_up_bias.values[e * two_inter + 2 * i], u = gate_up_bias.values[e * two_inter + 2 * i + 1];
          for (let h = 0; h < hidden; ++h) {
            g += x[h] * gate_up.values[(e * hidden + h) * two_inter + 2 * i];
            u += x[h] * gate_up.values[(e * hidden + h) * two_inter + 2 * i + 1];
          }
          g = Math.min(g, limit);
          u = Math.min(Math.max(u, -limit), limit);
          glu[i] = (u + 1) * g * sigmoid(alpha * g);
        }
        const weight = exp[j] / total;
        for (let h = 0; h < hidden; ++h) {
          let sum = down_bias.values[e * hidden + h];
          for (let i = 0; i < inter; ++i) sum += glu[i] * down.values[(e * inter + i) * hidden + h];
          out[h] += weight * sum;
        }
      });
      return out;
    }
    if (this.family.moe === "mixtral") {  // always renormalised
      const logits = linear(this.tensor(p + "block_sparse_moe.gate.weight"), x);
      const [order, weights] = reference_model.softmax_top_k(logits, c.num_experts_per_tok, true);
      order.forEach((e, j) => {
        const q = `${p}block_sparse_moe.experts.${e}.`;
        const y = this.gated(x, this.tensor(q + "w1.weight"), this.tensor(q + "w3.weight"), this.tensor(q + "w2.weight"));
        for (let h = 0; h < this.hidden; ++h) out[h] += weights[j] * y[h];
      });
      return out;
    }
    // Qwen2-MoE / Qwen3-MoE
    const logits = linear(this.tensor(p + "mlp.gate.weight"), x);
    const [order, weights] = reference_model.softmax_top_k(logits, c.num_experts_per_tok, !!c.norm_topk_prob);
    order.forEach((e, j) => {
      const q = `${p}mlp.experts.${e}.`;
      const y = this.gated(x, this.tensor(q + "gate_proj.weight"), this.tensor(q + "up_proj.weight"), this.tensor(q + "down_proj.weight"));
      for (let h = 0; h < this.hidden; ++h) out[h] += weights[j] * y[h];
    });
    if (this.tensor(p + "mlp.shared_expert_gate.weight")) {
      const q = p + "mlp.shared_expert.";
      const y = this.gated(x, this.tensor(q + "gate_proj.weight"), this.tensor(q + "up_proj.weight"), this.tensor(q + "down_proj.weight"));
      const gate = sigmoid(linear(this.tensor(p + "mlp.shared_expert_gate.weight"), x)[0]);
      for (let h = 0; h < this.hidden; ++h) out[h] += gate * y[h];
    }
    return out;
  }

  feed(token) {
    const { hidden, num_heads, num_kv_heads, head_dim, config: c } = this;
    const group = num_heads / num_kv_heads;
    const position = this.keys[0].length;
    const embed = this.tensor("model.embed_tokens.weight");
    if (token < 0 || token >= embed.shape[0]) throw new Error(`token id ${token} is outside the vocabulary`);
    const x = embed.values.slice(token * hidden, (token + 1) * hidden);
    if (this.family.gemma) for (let i = 0; i < hidden; ++i) x[i] *= Math.sqrt(hidden);
    for (let l = 0; l < c.num_hidden_layers; ++l) {
      const p = `model.layers.${l}.`;
      const h = Float64Array.from(x);
      this.norm(h, this.tensor(p + "input_layernorm.weight"));
      const [q, k, v] = this.qkv(p, h);
      if (this.family.qk_norm) {
        for (let hd = 0; hd < num_heads; ++hd) this.norm(q, this.tensor(p + "self_attn.q_norm.weight"), hd * head_dim, head_dim);
        for (let hd = 0; hd < num_kv_heads; ++hd) this.norm(k, this.tensor(p + "self_attn.k_norm.weight"), hd * head_dim, head_dim);
      }
      rope(q, num_heads, head_dim, position, this.rotary[l]);
      rope(k, num_kv_heads, head_dim, position, this.rotary[l]);
      this.keys[l].push(k);
      this.values[l].push(v);
      const ks = this.keys[l], vs = this.values[l];
      // A sliding layer sees the last sliding_window positions, its own included.
      const first = this.sliding[l] ? Math.max(0, ks.length - c.sliding_window) : 0;
      const sinks = this.tensor(p + "self_attn.sinks");
      const cap = c.attn_logit_softcapping;

      const attended = new Float64Array(num_heads * head_dim);
      for (let hd = 0; hd < num_heads; ++hd) {
        const kv = Math.floor(hd / group);
        const scores = [];
        for (let s = first; s < ks.length; ++s) {
          let dot = 0;
          for (let i = 0; i < head_dim; ++i) dot += q[hd * head_dim + i] * ks[s][kv * head_dim + i];
          let score = dot * this.scale;
          if (cap) score = cap * Math.tanh(score / cap);
          scores.push(score);
        }
        const sink = sinks ? sinks.values[hd] : -Infinity;
        const top = Math.max(...scores, sink);
        const weights = scores.map((score) => Math.exp(score - top));
        const total = weights.reduce((a, b) => a + b, 0) + Math.exp(sink - top);
        for (let s = first; s < vs.length; ++s) {
          const w = weights[s - first] / total;
          for (let i = 0; i < head_dim; ++i) attended[hd * head_dim + i] += w * vs[s][kv * head_dim + i];
        }
      }
      const o = linear(this.tensor(p + "self_attn.o_proj.weight"), attended, this.tensor(p + "self_attn.o_proj.bias"));
      if (this.family.gemma) this.norm(o, this.tensor(p + "post_attention_layernorm.weight"));
      for (let i = 0; i < hidden; ++i) x[i] += o[i];
      const g = Float64Array.from(x);
      this.norm(g, this.tensor(p + (this.family.gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight")));
      const f = this.family.moe ? this.moe(p, g) : this.mlp(p, g);
      if (this.family.gemma) this.norm(f, this.tensor(p + "post_feedforward_layernorm.weight"));
      for (let i = 0; i < hidden; ++i) x[i] += f[i];
    }
    this.norm(x, this.tensor("model.norm.weight"));
    this.last_hidden = x;
    const tied = c.tie_word_embeddings ?? !!this.family.gemma;
    const logits = linear((!tied && this.tensor("lm_head.weight")) || embed, x);
    const final_cap = c.final_logit_softcapping;
    if (final_cap) for (let i = 0; i < logits.length; ++i) logits[i] = final_cap * Math.tanh(logits[i] / final_cap);
    return logits;
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
    const rounded = (logits) => Array.from(logits, (v) => Number(v.toPrecision(9)));
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
    const prompt_logits = [];
    run.prompt_ids.forEach((id, i) => {
      logits = model.feed(id);
      if (run.prompt_logits && i + 1 < run.prompt_ids.length) prompt_logits.push(rounded(logits));
    });
    const steps = [];
    for (let s = 0; s < run.forced_ids.length; ++s) {
      steps.push(rounded(logits));
      if (s + 1 < run.forced_ids.length) logits = model.feed(run.forced_ids[s]);
    }
    process.stdout.write(JSON.stringify({ logits: steps, ...(run.prompt_logits ? { prompt_logits } : {}) }) + "\n");
  }
}

try {
  main();
} catch (error) {
  process.stderr.write(`llama_reference: ${error && error.message ? error.message : error}\n`);
  process.exit(1);
}
