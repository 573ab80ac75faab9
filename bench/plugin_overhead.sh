#!/usr/bin/env bash
# What plugins cost a served model (issue 28): an empty request + output plugin on every request,
# and an empty logits hook on every step, against no plugin, at N concurrent streams. Two servers
# on the same model: A loads no plugin; B loads tests/plugins/test_plugins/empty.c (its hooks do
# nothing). Three configurations take turns round by round, so a change in the machine's load
# hits all three: A; B with plain requests (request and output hooks run); B with requests that
# name the plugin (the logits hook runs too, once per request per step). Each reports the best
# of its rounds (bench/serve_throughput_bench.cpp), then B's /metrics gives the hooks' own time.
#
#   bench/plugin_overhead.sh BUILD_DIR [MODEL=../shared/models/stories260K/hf] [STREAMS=32] [ROUNDS=3] [THREADS=1]
set -euo pipefail

build=${1:?usage: plugin_overhead.sh BUILD_DIR [MODEL] [STREAMS] [ROUNDS] [THREADS]}
here=$(cd "$(dirname "$0")" && pwd)
model=${2:-$here/../../shared/models/stories260K/hf}
streams=${3:-32}
rounds=${4:-3}
threads=${5:-1}
plugin="$build/tests/plugins/libtest_plugin_empty.so"
[[ -f "$plugin" ]] || { echo "no $plugin: build the target test_plugin_empty" >&2; exit 1; }
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$model/config.json")

logs=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$logs"
}
trap cleanup EXIT

# Starts a server (extra flags after the name); sets endpoint_NAME and http_NAME from its log.
start() {
  local name=$1; shift
  "$build/bin/troupe" serve --model "$model" --threads "$threads" --zmq-endpoint 'tcp://127.0.0.1:*' \
    --http on --http-port 0 --max-num-seqs "$streams" --log-level info "$@" 2>"$logs/$name.log" &
  pids+=($!)
  local endpoint="" port=""
  for _ in $(seq 120); do
    endpoint=$(sed -n 's/.*zmq door: listening on \(tcp:[^ ]*\).*/\1/p' "$logs/$name.log" | head -n 1)
    port=$(sed -n 's|.*HTTP API on http://[^ :]*:\([0-9]*\)/v1.*|\1|p' "$logs/$name.log" | head -n 1)
    [[ -n "$endpoint" && -n "$port" ]] && break
    sleep 0.5
  done
  [[ -n "$endpoint" && -n "$port" ]] || { echo "server $name logged no endpoint:" >&2; cat "$logs/$name.log" >&2; exit 1; }
  printf -v "endpoint_$name" '%s' "$endpoint"
  printf -v "http_$name" '%s' "$port"
}

start none
start empty --plugin "$plugin"

bench() {  # ENDPOINT [--plugins NAME]: prints the round's tok/s
  "${TROUPE_BENCH_SERVE:-$build/bench/troupe_bench_serve}" --endpoint "$1" --streams "$streams" --reps 1 --vocab "$vocab" "${@:2}" |
    sed -n 's/^best: streams [0-9]*: \([0-9.]*\) tok\/s.*/\1/p'
}

echo "plugin overhead: $(basename "$(dirname "$model")") ($model), $streams streams, $rounds rounds, $threads threads," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
best_none=0 best_ro=0 best_logits=0
for round in $(seq "$rounds"); do
  none=$(bench "$endpoint_none")
  ro=$(bench "$endpoint_empty")
  logits=$(bench "$endpoint_empty" --plugins empty)
  echo "round $round: no plugin $none tok/s, request+output $ro tok/s, request+output+logits $logits tok/s"
  best_none=$(python3 -c "print(max($best_none, $none))")
  best_ro=$(python3 -c "print(max($best_ro, $ro))")
  best_logits=$(python3 -c "print(max($best_logits, $logits))")
done
python3 - "$best_none" "$best_ro" "$best_logits" "$streams" <<'PY'
import sys
none, ro, logits, streams = map(float, sys.argv[1:])
print(f"best: no plugin {none:.1f} tok/s; request+output {ro:.1f} tok/s ({(ro / none - 1) * 100:+.2f} %); "
      f"request+output+logits {logits:.1f} tok/s ({(logits / none - 1) * 100:+.2f} %)")
print(f"step time at {int(streams)} streams (one token per stream per step): no plugin {streams / none * 1e3:.3f} ms, "
      f"with every hook {streams / logits * 1e3:.3f} ms")
PY
echo "the empty plugin's own time, from server B's /metrics:"
curl -s "http://127.0.0.1:$http_empty/metrics" | grep -E '^troupe:plugin_(calls_total|call_seconds_total|call_p50_seconds|call_p99_seconds)\{' |
  python3 -c "
import sys, re
rows = {}
for line in sys.stdin:
    m = re.match(r'(troupe:plugin_\w+)\{.*stage=\"(\w+)\",plugin=\"(\w+)\",hook=\"(\w+)\"\} (\S+)', line)
    if m: rows.setdefault((m.group(2), m.group(4)), {})[m.group(1)] = float(m.group(5))
for (stage, hook), r in sorted(rows.items()):
    calls = r.get('troupe:plugin_calls_total', 0)
    total = r.get('troupe:plugin_call_seconds_total', 0)
    mean_us = total / calls * 1e6 if calls else 0
    print(f'  {stage:12} {hook:8} {int(calls):9d} calls, mean {mean_us:.2f} us, p50 {r.get(\"troupe:plugin_call_p50_seconds\", 0) * 1e6:.1f} us,'
          f' p99 {r.get(\"troupe:plugin_call_p99_seconds\", 0) * 1e6:.1f} us (bucket edges)')
"
