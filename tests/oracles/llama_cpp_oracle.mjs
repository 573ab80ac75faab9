// llama.cpp (through node-llama-cpp's prebuilt CPU binaries, fully offline) as an independent
// reference for greedy decoding of a GGUF model.
//
// Usage:
//   node llama_cpp_oracle.mjs --model FILE.gguf --prompt-ids 1,403,407 [--steps N] [--logits K]
//
//   --model       GGUF file to load (any architecture llama.cpp supports); may be repeated to
//                 run several models in one process (llama.cpp starts once: much faster)
//   --prompt-ids  comma-separated prompt token ids, BOS included if wanted (nothing is added)
//   --steps       number of new tokens to generate greedily (default 16)
//   --logits K    also print, per step, the top K (id, logit) pairs (default 0: none)
//   --f32-kv-cache  K/V cache in F32 and flash attention off. llama.cpp's defaults (F16 cache,
//                 flash attention on the CPU) round queries, keys, values and attention weights
//                 to f16, which moves the logits of the architecture tests' models by ~1e-2;
//                 with this flag they stay within ~1e-5 of a float64 forward pass
//   --prompt-logits K  also print the top K (id, logit) pairs after every prompt position but the
//                 last ("prompt_top"), from the same prompt evaluation
//   --context-size N  llama.cpp's context (default: prompt + steps + 8). Phi-3's longrope picks
//                 its long factors by it, as Troupe does by the context it serves
//   --forced-ids  teacher forcing: feed these ids instead of each step's argmax (one step per
//                 id; --steps is ignored); generated_ids still reports each step's argmax
//   --all-prompt-logits  also print the whole vocabulary's logits after every prompt position
//                 (the prompt is evaluated in one batch asking for all of them), rounded to 1e-5
//
// Prints one JSON object per model on stdout, one line each, in --model order:
//   {"model": "...", "prompt_ids": [...], "generated_ids": [...],
//    "margins": [...],            // per step: logit(top-1) - logit(top-2), raw logits
//    "top": [[[id, logit], ...]]  // only with --logits K
//    "prompt_logits": [[...]]     // only with --all-prompt-logits: [prompt length][vocabulary]
//   }
// llama.cpp runs on one CPU thread: the models checked are tiny, and idle spinning threads on
// a shared machine cost seconds per model.
// Greedy is the argmax of the raw logits (ties go to the lower id); no sampler, no seed, no
// repeat penalty. Generation does not stop at EOS: exactly --steps tokens are produced.
// Exit status 0 on success; on failure an error message on stderr and status 1.

import { getLlama, LlamaLogLevel } from "node-llama-cpp";

function parse_args(argv) {
  const args = { models: [], steps: 16, logits: 0 };
  for (let i = 0; i < argv.length; ++i) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (flag === "--model") args.models.push(value);
    else if (flag === "--prompt-ids") args.prompt_ids = value.split(",").filter((s) => s.length).map(Number);
    else if (flag === "--steps") args.steps = Number(value);
    else if (flag === "--logits") args.logits = Number(value);
    else if (flag === "--context-size") args.context_size = Number(value);
    else if (flag === "--prompt-logits") args.prompt_logits = Number(value);
    else if (flag === "--f32-kv-cache") {
      args.f32_kv_cache = true;
      continue;
    } else if (flag === "--all-prompt-logits") {
      args.all_prompt_logits = true;
      continue;
    } else if (flag === "--forced-ids") args.forced_ids = value.split(",").filter((s) => s.length).map(Number);
    else throw new Error(`unknown argument '${flag}'`);
    ++i;
  }
  if (args.models.length === 0) throw new Error("--model FILE.gguf is required");
  if (!args.prompt_ids || args.prompt_ids.length === 0) throw new Error("--prompt-ids is required");
  if (args.prompt_ids.some((id) => !Number.isInteger(id) || id < 0)) throw new Error("--prompt-ids must be non-negative integers");
  if (args.forced_ids) {
    if (args.forced_ids.length === 0 || args.forced_ids.some((id) => !Number.isInteger(id) || id < 0)) {
      throw new Error("--forced-ids must be non-negative integers");
    }
    args.steps = args.forced_ids.length;
  }
  return args;
}

// Top-k of a logits Map<token, logit> (or Float32Array), ties broken by the lower id.
function top_k(logits, k) {
  const entries = logits instanceof Map ? [...logits.entries()] : [...logits].map((v, i) => [i, v]);
  entries.sort((a, b) => (b[1] - a[1]) || (a[0] - b[0]));
  return entries.slice(0, k);
}

// Every token's logit (a Map<token, logit> or a Float32Array), rounded to 1e-5, as an array.
function full_logits(logits) {
  const values = logits instanceof Map ? new Array(Math.max(...logits.keys()) + 1).fill(0) : Array.from(logits);
  if (logits instanceof Map) for (const [id, v] of logits) values[id] = v;
  return values.map((v) => Math.round(v * 1e5) / 1e5);
}

async function run_model(llama, model_path, args) {
  const model = await llama.loadModel({ modelPath: model_path, gpuLayers: 0 });
  const context_size = args.context_size ?? args.prompt_ids.length + args.steps + 8;
  const precision = args.f32_kv_cache
    ? { experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32", flashAttention: false }
    : {};
  const context = await model.createContext({ contextSize: context_size, batchSize: context_size, sequences: 1, threads: 1, ...precision });
  const sequence = context.getSequence();

  const generated = [];
  const margins = [];
  const tops = [];
  const prompt_top = [];
  const prompt_logits = [];
  let input = args.prompt_ids;
  for (let step = 0; step < args.steps; ++step) {
    const every = step === 0 && (args.prompt_logits > 0 || args.all_prompt_logits);
    const items = input.map((id, i) => (i === input.length - 1 || every ? [id, { generateNext: { logits: true } }] : id));
    const results = await sequence.controlledEvaluate(items);
    if (every) {
      for (let i = 0; i < input.length; ++i) {
        if (!results[i] || !results[i].next || !results[i].next.logits) throw new Error(`no logits returned at prompt position ${i}`);
        if (args.prompt_logits > 0 && i + 1 < input.length) prompt_top.push(top_k(results[i].next.logits, args.prompt_logits));
        if (args.all_prompt_logits) prompt_logits.push(full_logits(results[i].next.logits));
      }
    }
    const last = results[input.length - 1];
    if (!last || !last.next || !last.next.logits) throw new Error(`no logits returned at step ${step}`);
    const best = top_k(last.next.logits, Math.max(2, args.logits));
    generated.push(best[0][0]);
    margins.push(best[0][1] - best[1][1]);
    if (args.logits > 0) tops.push(best.slice(0, args.logits));
    input = [args.forced_ids ? args.forced_ids[step] : best[0][0]];
  }
  process.stdout.write(JSON.stringify({ model: model_path, prompt_ids: args.prompt_ids, generated_ids: generated, margins,
    ...(args.logits > 0 ? { top: tops } : {}), ...(args.prompt_logits > 0 ? { prompt_top } : {}),
    ...(args.all_prompt_logits ? { prompt_logits } : {}) }) + "\n");
  await context.dispose();
  await model.dispose();
}

async function main() {
  const args = parse_args(process.argv.slice(2));
  // build: "never" keeps it offline: only the prebuilt binaries shipped in node_modules are used.
  const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false });
  for (const model_path of args.models) await run_model(llama, model_path, args);
  await llama.dispose();
}

main().catch((error) => {
  process.stderr.write(`llama_cpp_oracle: ${error && error.message ? error.message : error}\n`);
  process.exit(1);
});
