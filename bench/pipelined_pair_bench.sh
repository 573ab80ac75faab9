#!/usr/bin/env bash
# A prefill/decode pair of pipelines against a plain pair (issue 27): what the pipelines' stages
# cost, and where their KV goes. Every topology is `troupe launch` of a prefill node and a decode
# node (one thread each, mutual TLS); the pipelined ones give each node a `troupe stage` of the
# model's first half ([pipeline] prefill_stages / decode_stages, the stages with the cluster's
# keys: CURVE links). "engines": the stages' KV goes through both engines (kv_stage_pairs =
# false: the prefill's engine fetches it over its stage link, the decode's writes it into its
# stage); "pairs": the prefill's stage sends it straight to the decode's (a KV channel per pair of
# stages). tools/bench sends the same requests to each at every rate, ROUNDS times, the order
# rotating from round to round (load from elsewhere falls on all alike). One line per run.
#
#   bench/pipelined_pair_bench.sh BUILD_DIR MODEL_DIR [RATES="5 20"] [ROUNDS=2] [PROMPTS=100]
#   environment: INPUT_LEN=128 OUTPUT_LEN=32 OUT=DIR (keeps the logs and bench outputs)
set -euo pipefail

build=$(cd "${1:?usage: pipelined_pair_bench.sh BUILD_DIR MODEL_DIR [RATES] [ROUNDS] [PROMPTS]}" && pwd)
model=$(realpath "${2:?model directory}")
rates=${3:-5 20}
rounds=${4:-2}
prompts=${5:-100}
input_len=${INPUT_LEN:-128}
output_len=${OUTPUT_LEN:-32}
troupe="$build/bin/troupe"
bench="$build/bin/troupe-bench"
read -r num_layers vocab < <(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c['num_hidden_layers'], c['vocab_size'])" "$model/config.json")
stage_layers="0-$((num_layers / 2 - 1))"

work=${OUT:-$(mktemp -d)}
mkdir -p "$work"
children=()
cleanup() {
  for pid in "${children[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${children[@]}"; do wait "$pid" 2>/dev/null || true; done
  children=()
}
trap 'cleanup; [[ -n "${OUT:-}" ]] || rm -rf "$work"' EXIT

free_port() { python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
"$troupe" certs --out "$work/certs" --name controller --name prefill-a --name decode-a --name stage-prefill \
  --name stage-decode > /dev/null

# Waits, bounded, until `file` holds `words`.
wait_for() {
  local file=$1 words=$2
  for _ in $(seq 600); do
    grep -q "$words" "$file" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "no '$words' in $file:" >&2
  tail -20 "$file" >&2
  exit 1
}

topology() {  # $1 plain|engines|pairs, then the two stages' endpoints for a pipelined one
  cat <<TOML
[model]
path = "$model"
load_format = "auto"
[node]
device = "cpu"
threads = 1
[frontend]
zmq_endpoint = "tcp://127.0.0.1:$zmq_port"
[scheduler]
max_num_batched_tokens = 2048
max_num_seqs = 128
kv_memory_mb = 128
[cluster]
credentials = "$work/certs"
name = "controller"
[[nodes]]
name = "prefill-a"
address = "127.0.0.1:$(free_port)"
[[nodes]]
name = "decode-a"
address = "127.0.0.1:$(free_port)"
[placement]
prefill = ["prefill-a"]
decode = ["decode-a"]
TOML
  if [[ $1 != plain ]]; then
    cat <<TOML
[pipeline]
prefill_stages = [{ endpoint = "$2", layers = "$stage_layers" }]
decode_stages = [{ endpoint = "$3", layers = "$stage_layers" }]
micro_batches = 2
kv_stage_pairs = $([[ $1 == pairs ]] && echo true || echo false)
TOML
  fi
}

run() {  # $1 plain|engines|pairs $2 rate $3 round
  local kind=$1 rate=$2 round=$3 name="$1-$2-$3"
  zmq_port=$(free_port)
  if [[ $kind != plain ]]; then
    local endpoints=()
    for side in prefill decode; do
      "$troupe" stage --model "$model" --layers "$stage_layers" --threads 1 --credentials "$work/certs" \
        --name "stage-$side" > "$work/$name-$side-stage.log" 2>&1 &
      children+=($!)
      wait_for "$work/$name-$side-stage.log" "listening on"
      endpoints+=("$(grep -o 'listening on curve://[^ ]*' "$work/$name-$side-stage.log" | head -1 | cut -d' ' -f3)")
    done
    topology "$kind" "${endpoints[0]}" "${endpoints[1]}" > "$work/$name.toml"
  else
    topology plain > "$work/$name.toml"
  fi
  "$troupe" launch "$work/$name.toml" > "$work/$name-launch.log" 2>&1 &
  children+=($!)
  wait_for "$work/$name-launch.log" "engine instance 1 on"
  "$bench" --endpoint "tcp://127.0.0.1:$zmq_port" --num-prompts "$prompts" --input-len "$input_len" \
    --output-len "$output_len" --vocab-size "$vocab" --request-rate "$rate" --seed "$round" \
    > "$work/$name-bench.txt" 2>&1
  cleanup
  printf '%-9s %5s req/s round %s: ' "$kind" "$rate" "$round"
  grep -E "Failed requests|Request throughput|Mean TTFT|P90 TTFT|Mean TPOT|P90 TPOT" "$work/$name-bench.txt" |
    sed -E 's/ +/ /g; s/ \((req\/s|ms)\)//' | paste -sd ';' -
}

echo "pipelined_pair_bench: $(basename "$model") ($num_layers layers, stages of layers $stage_layers), rates $rates," \
  "$rounds rounds of $prompts prompts, $input_len/$output_len tokens; $(nproc) CPUs, load average $(cut -d' ' -f1 /proc/loadavg)"
for round in $(seq 1 "$rounds"); do
  for rate in $rates; do
    case $((round % 3)) in
      1) order="plain engines pairs" ;;
      2) order="engines pairs plain" ;;
      *) order="pairs plain engines" ;;
    esac
    for kind in $order; do run "$kind" "$rate" "$round"; done
  done
done
