// llama.cpp's single-stream speed on a GGUF file (node-llama-cpp's prebuilt CPU build, offline),
// measured the way troupe_bench_cpu measures Troupe: one prompt of --prompt tokens evaluated in
// one batch (prompt tokens/s = prompt / time to the first generated token), then --decode tokens
// generated greedily one at a time (decode tokens/s).
//
//   node bench/llama_cpp_bench.mjs --model FILE.gguf [--threads N] [--prompt 512] [--decode 64] [--reps 3]
//                                  [--warmup 1]
// --warmup 0 skips the warm-up round (long contexts, where one round takes minutes).

const oracle_modules = new URL("../tests/oracles/node_modules/node-llama-cpp/dist/index.js", import.meta.url);
const { getLlama, LlamaLogLevel } = await import(oracle_modules.href);

function parse_args(argv) {
  const args = { threads: 0, prompt: 512, decode: 64, reps: 3, warmup: 1 };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (flag === "--model") args.model = value;
    else if (flag === "--threads") args.threads = Number(value);
    else if (flag === "--prompt") args.prompt = Number(value);
    else if (flag === "--decode") args.decode = Number(value);
    else if (flag === "--reps") args.reps = Number(value);
    else if (flag === "--warmup") args.warmup = Number(value);
    else throw new Error(`unknown argument '${flag}'`);
  }
  if (!args.model) throw new Error("--model FILE.gguf is required");
  return args;
}

const args = parse_args(process.argv.slice(2));
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false,
                               ...(args.threads > 0 ? { maxThreads: args.threads } : {}) });
const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0 });
const context_size = args.prompt + args.decode + 16;
const context = await model.createContext({ contextSize: context_size, batchSize: args.prompt, sequences: 1,
                                            ...(args.threads > 0 ? { threads: { ideal: args.threads, min: args.threads } } : {}) });
const prompt = Array.from({ length: args.prompt }, (_, t) => 5 + (t % 97));
// Memory once the model and its context exist, as troupe_bench_cpu prints it (MB of /proc/self/status).
const { readFileSync } = await import("node:fs");
const status_mb = (field) => Number(readFileSync("/proc/self/status", "utf8").match(new RegExp(`${field}:\\s+(\\d+)`))[1]) * 1024 / 1e6;
console.log(`after load: VmRSS ${status_mb("VmRSS").toFixed(0)} MB, VmHWM ${status_mb("VmHWM").toFixed(0)} MB`);

let best_prompt = 0, best_decode = 0;
for (let rep = 1 - args.warmup; rep <= args.reps; ++rep) {  // round 0 warms up
  const sequence = context.getSequence();
  const start = performance.now();
  let first = 0, count = 0;
  for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
    if (count === 0) first = performance.now();
    if (++count > args.decode) break;
  }
  const end = performance.now();
  const prompt_tps = args.prompt / ((first - start) / 1000);
  const decode_tps = args.decode / ((end - first) / 1000);
  sequence.dispose();
  if (rep <= 0) continue;
  best_prompt = Math.max(best_prompt, prompt_tps);
  best_decode = Math.max(best_decode, decode_tps);
  console.log(`rep ${rep}: prompt ${prompt_tps.toFixed(1)} tok/s, decode ${decode_tps.toFixed(2)} tok/s`);
}
console.log(`best: prompt ${best_prompt.toFixed(1)} tok/s, decode ${best_decode.toFixed(2)} tok/s (threads ${context.currentThreads ?? args.threads})`);
await context.dispose();
await model.dispose();
await llama.dispose();
