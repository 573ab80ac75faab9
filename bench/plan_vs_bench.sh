#!/usr/bin/env bash
# `troupe plan` against tools/bench (issue 29): does the plan predict the SLO attainment a server
# measures? One topology is served (colocated: `troupe serve`; 1p1d: `troupe launch` of a
# prefill node and a decode node), tools/bench measures the attainment at every rate, ROUNDS
# times with the order of the rates alternating (on a shared machine the spread between rounds
# is part of the answer), and then `troupe plan` predicts the same rates for the same requests
# (--bench-run: the very arrivals and lengths tools/bench sent) from two step-time models: the
# serving instance's own fit (--metrics-url, after the rounds) and a short calibration of the
# model alone (--calibrate); each of them again on the machine's cores shared with the serving
# stack and the client (--cores: the stack's CPU read from the server's /metrics, the client's from
# its bench run). With STEP_MODEL set (e.g. the colocated run's fit, printed as
# "step-time model: ..."), a third prediction uses it: a 1P1D plan from a colocated profile.
#
#   bench/plan_vs_bench.sh BUILD_DIR MODEL TOPOLOGY RATES [ROUNDS=2] [PROMPTS=200]
#     TOPOLOGY colocated | 1p1d; RATES comma-separated requests/s
#   environment: INPUT_LEN=128 OUTPUT_LEN=32 SLO=ttft=200ms,tpot=20ms THREADS=1 STEP_MODEL=... OUT=DIR
#   THREADS: the server's compute threads, and the plans' (an instance's step keeps them busy)
set -euo pipefail

build=$(cd "${1:?usage: plan_vs_bench.sh BUILD_DIR MODEL TOPOLOGY RATES [ROUNDS] [PROMPTS]}" && pwd)
model=$(realpath "${2:?model}")
topology=${3:?colocated or 1p1d}
rates=${4:?rates}
rounds=${5:-2}
prompts=${6:-200}
input_len=${INPUT_LEN:-128}
output_len=${OUTPUT_LEN:-32}
slo=${SLO:-ttft=200ms,tpot=20ms}
threads=${THREADS:-1}
troupe="$build/bin/troupe"
bench="$build/bin/troupe-bench"
case "$topology" in colocated | 1p1d) ;; *) echo "TOPOLOGY must be colocated or 1p1d" >&2; exit 2 ;; esac
config="$model/config.json"
[[ -f "$config" ]] || config="$(dirname "$model")/config.json"
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$config")
context=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['max_position_embeddings'])" "$config")

# OUT keeps the server log, every bench JSON and the plans; without it they go at the end.
work=${OUT:-$(mktemp -d)}
mkdir -p "$work"
server=""
cleanup() {
  if [[ -n "$server" ]]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  [[ -n "${OUT:-}" ]] || rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
zmq_port=$(port)
http_port=$(port)
{
  echo "[model]"
  echo "path = \"$model\""
  echo "[node]"
  echo "device = \"cpu\""
  echo "threads = $threads"
  echo "[frontend]"
  echo "zmq_endpoint = \"tcp://127.0.0.1:$zmq_port\""
  echo "[http]"
  echo "enabled = true"
  echo "host = \"127.0.0.1\""
  echo "port = $http_port"
  echo "[scheduler]"
  echo "kv_memory_mb = 64"
  if [[ "$topology" == 1p1d ]]; then
    echo "[cluster]"
    echo "credentials = \"$work/certs\""
    echo "name = \"controller\""
    echo "[[nodes]]"
    echo "name = \"prefill-a\""
    echo "address = \"127.0.0.1:$(port)\""
    echo "[[nodes]]"
    echo "name = \"decode-a\""
    echo "address = \"127.0.0.1:$(port)\""
    echo "[placement]"
    echo "tokenizers = [\"controller\"]"
    echo "prefill = [\"prefill-a\"]"
    echo "decode = [\"decode-a\"]"
    echo "detokenizers = [\"controller\"]"
  fi
} >"$work/topology.toml"
if [[ "$topology" == 1p1d ]]; then
  "$troupe" certs --out "$work/certs" --name controller --name prefill-a --name decode-a >"$work/certs.log" 2>&1
  "$troupe" launch "$work/topology.toml" --log-level info >"$work/server.log" 2>&1 &
else
  "$troupe" serve --config "$work/topology.toml" --log-level info >"$work/server.log" 2>&1 &
fi
server=$!
for _ in $(seq 300); do
  grep -q "serving: ZeroMQ on" "$work/server.log" && break
  kill -0 "$server" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
  sleep 0.2
done
grep -q "serving: ZeroMQ on" "$work/server.log" || { echo "the server did not start" >&2; exit 1; }

run_bench() {  # RATE JSON
  "$bench" --endpoint "tcp://127.0.0.1:$zmq_port" --vocab-size "$vocab" --input-len "$input_len" \
    --output-len "$output_len" --request-rate "$1" --num-prompts "$prompts" --slo "$slo" --json "$2" >/dev/null 2>&1
}
echo "plan_vs_bench: $topology, $(basename "$model"), $threads compute threads, rates $rates, $rounds rounds of $prompts prompts," \
  "${input_len}/${output_len} tokens, SLO $slo; $(nproc) CPUs, load average $(cut -d' ' -f1 /proc/loadavg)"
run_bench 4 "$work/warmup.json"
IFS=, read -r -a rate_list <<<"$rates"
for round in $(seq "$rounds"); do
  order=("${rate_list[@]}")
  if ((round % 2 == 0)); then
    order=()
    for ((i = ${#rate_list[@]} - 1; i >= 0; i--)); do order+=("${rate_list[i]}"); done
  fi
  for rate in "${order[@]}"; do run_bench "$rate" "$work/measured-$rate-$round.json"; done
done

# The plans, on the requests tools/bench sent at the first rate (rescaled to each rate).
plan_args=(--bench-run "$work/measured-${rate_list[0]}-1.json" --rates "$rates" --slo "$slo" --max-model-len "$context")
if [[ "$topology" == 1p1d ]]; then plan_args+=(--workers 2); fi
plan() {  # NAME ARGS... -> the topology's rows as "rate attainment" lines in $work/NAME.plan
  local name=$1
  shift
  "$troupe" plan "${plan_args[@]}" "$@" --out "$work/plan-$name" >"$work/$name.out" 2>"$work/$name.err" ||
    { cat "$work/$name.err" >&2; return 1; }
  grep "^step-time model" "$work/$name.out" | sed "s/^/  $name: /"
  local row="colocated x1"
  [[ "$topology" == 1p1d ]] && row="1P1D"
  grep "^$row," "$work/$name.out" | awk '{for (i = 1; i <= NF; i++) if ($i ~ /%$/) { print $(i - 1), $i; break }}' \
    >"$work/$name.plan"
}
plan server --metrics-url "http://127.0.0.1:$http_port"
# On the cores the server, its serving stack and the client share: the stack's CPU from the
# server's /metrics, the client's from the bench run (troupe plan --cores).
cores=$(nproc)
plan server_shared --metrics-url "http://127.0.0.1:$http_port" --cores "$cores" --threads "$threads"
stack_ms=$(sed -n 's/.*serving stack \([0-9.e+-]*\) ms a request.*/\1/p' "$work/server_shared.out")
stack_threads=$(sed -n 's/.* on \([0-9]*\) threads;.*/\1/p' "$work/server_shared.out")
grep "^shared cores" "$work/server_shared.out" | sed "s/^/  /"
kill "$server" 2>/dev/null || true
wait "$server" 2>/dev/null || true
server=""
plan calibrate --calibrate "$model" --threads "$threads" --kv-memory-mb 64
# The same calibration on the shared cores (a second calibration would differ by the machine's
# minute as much as the two models do).
read -r -a calibrated <<<"$(sed -n 's/^as flags: //p' "$work/calibrate.out")"
plan calibrate_shared "${calibrated[@]}" --cores "$cores" --threads "$threads" \
  --stack-ms-per-request "$stack_ms" --stack-ms-per-token "$stack_ms" --stack-threads "$stack_threads"
columns=(server server_shared calibrate calibrate_shared)
if [[ -n "${STEP_MODEL:-}" ]]; then
  plan given --step-model "$STEP_MODEL" --num-kv-blocks "$(sed -n 's/.*; \([0-9]*\) KV blocks.*/\1/p' "$work/server.out")"
  columns+=(given)
fi

python3 - "$work" "$rates" "$rounds" "${columns[@]}" <<'EOF'
import json, sys
work, rates, rounds, columns = sys.argv[1], sys.argv[2].split(','), int(sys.argv[3]), sys.argv[4:]
plans = {}
for c in columns:
    plans[c] = {}
    for line in open(f"{work}/{c}.plan"):
        rate, met = line.split()
        plans[c][float(rate)] = float(met.rstrip('%'))
print("| rate | measured SLO attainment (rounds) | mean | " + " | ".join(f"plan, {c} (off by)" for c in columns) + " |")
print("|---|---|---|" + "---|" * len(columns))
for rate in rates:
    got = [100 * json.load(open(f"{work}/measured-{rate}-{r}.json"))["summary"]["slo_attainment"]
           for r in range(1, rounds + 1)]
    mean = sum(got) / len(got)
    cells = []
    for c in columns:
        p = plans[c].get(float(rate))
        cells.append("-" if p is None else f"{p:.1f} % ({p - mean:+.1f})")
    print(f"| {rate} | {', '.join(f'{g:.1f}' for g in got)} | {mean:.1f} % | " + " | ".join(cells) + " |")
EOF
