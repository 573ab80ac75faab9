// llama.cpp's aggregate tokens/s with N parallel sequences (node-llama-cpp's prebuilt CPU build,
// offline), measured the way troupe_bench_serve measures Troupe: N sequences of one context
// (`sequences: N`) each evaluate a prompt of --prompt token ids (different for every stream) and
// generate exactly --decode tokens greedily, all at once. node-llama-cpp gathers the sequences'
// pending tokens into one llama_decode batch per step (batched decoding). The figure is
// N·decode over the time until the last sequence finished, prompts included.
//
//   node bench/llama_cpp_parallel_bench.mjs --model FILE.gguf [--threads 2] [--streams 1,8,32]
//        [--prompt 32] [--decode 128] [--reps 3] [--vocab 32000]

import { readFileSync } from "node:fs";

const oracle_modules = new URL("../tests/oracles/node_modules/node-llama-cpp/dist/index.js", import.meta.url);
const { getLlama, LlamaLogLevel } = await import(oracle_modules.href);

function parse_args(argv) {
  const args = { threads: 2, streams: [1, 8, 32], prompt: 32, decode: 128, reps: 3, vocab: 32000 };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`flag '${flag}' needs a value`);
    if (flag === "--model") args.model = value;
    else if (flag === "--threads") args.threads = Number(value);
    else if (flag === "--streams") args.streams = value.split(",").map(Number);
    else if (flag === "--prompt") args.prompt = Number(value);
    else if (flag === "--decode") args.decode = Number(value);
    else if (flag === "--reps") args.reps = Number(value);
    else if (flag === "--vocab") args.vocab = Number(value);
    else throw new Error(`unknown argument '${flag}'`);
  }
  if (!args.model) throw new Error("--model FILE.gguf is required");
  if (args.streams.some((n) => !(n >= 1))) throw new Error("--streams takes counts >= 1, e.g. 1,8,32");
  return args;
}

function load_average() {
  return Number(readFileSync("/proc/loadavg", "utf8").split(" ")[0]);
}

const args = parse_args(process.argv.slice(2));
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false,
                               maxThreads: args.threads });
const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0 });
const vocab = args.vocab;
console.log(`llama.cpp: prompt ${args.prompt}, decode ${args.decode} tokens per stream, best of ${args.reps}, ` +
            `load average ${load_average().toFixed(2)}`);

let round = 0;
for (const streams of args.streams) {
  const per_sequence = args.prompt + args.decode + 16;
  const context = await model.createContext({
    contextSize: streams * per_sequence, sequences: streams, batchSize: Math.max(512, streams * args.prompt),
    threads: { ideal: args.threads, min: args.threads },
  });
  const sequences = Array.from({ length: streams }, () => context.getSequence());
  let best = 0, best_ttft = 0;
  for (let rep = 0; rep <= args.reps; ++rep) {  // rep 0 warms up
    const r = round++;
    const start = performance.now();
    const first_tokens = [];
    const counts = await Promise.all(sequences.map(async (sequence, s) => {
      const prompt = Array.from({ length: args.prompt }, (_, i) => 5 + (r * 131 + s * 37 + i * 11) % (vocab - 10));
      let count = 0;
      for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
        if (count === 0) first_tokens.push(performance.now());
        if (++count >= args.decode) break;
      }
      return count;
    }));
    const seconds = (performance.now() - start) / 1000;
    for (const count of counts) {
      if (count !== args.decode) throw new Error(`a sequence generated ${count} tokens, expected ${args.decode}`);
    }
    const tps = (streams * args.decode) / seconds;
    const ttft = (Math.max(...first_tokens) - start) / 1000;
    console.log(`  streams ${String(streams).padStart(2)} rep ${rep}: ${tps.toFixed(1)} tok/s (${seconds.toFixed(2)} s, ` +
                `slowest first token ${ttft.toFixed(3)} s)`);
    if (rep > 0 && tps > best) {
      best = tps;
      best_ttft = ttft;
    }
    for (const sequence of sequences) await sequence.clearHistory();
  }
  console.log(`best: streams ${streams}: ${best.toFixed(1)} tok/s (slowest first token ${best_ttft.toFixed(3)} s, ` +
              `threads ${context.currentThreads ?? args.threads})`);
  for (const sequence of sequences) sequence.dispose();
  await context.dispose();
}
console.log(`load average ${load_average().toFixed(2)} after the runs`);
await model.dispose();
await llama.dispose();
