#!/usr/bin/env bash
# On a lent GPU machine, in the repository's copy: runs what tools/gpu/bundle.sh packed.
#
#   bash .gpu/run.sh tests [GTEST_FILTER]     # test_cuda, every test (or those named)
#   bash .gpu/run.sh bench [TYPES...]         # the CUDA decode/prefill benchmark (bf16, q8_0, q4_k_m, ...)
#   bash .gpu/run.sh exec CMD...              # any command with the bundle's environment
#
# Output goes to stdout and, where $OUT is set (the device tool), to $OUT/<what>.log.
set -uo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)/troupe-gpu.tar.xz
here=/tmp/troupe-gpu
if [[ ! -f "$here/paths.env" ]]; then mkdir -p "$here" && tar -C "$here" -xJf "$bundle" || exit 1; fi
# shellcheck source=/dev/null
source "$here/paths.env"

# The build's absolute paths, baked into the tests, lead to the bundle.
for pair in "$built_binary_dir:$here/build" "$built_shared_dir:$here/shared"; do
  from=${pair%%:*} to=${pair#*:}
  if [[ ! -e "$from" ]]; then mkdir -p "$(dirname "$from")" && ln -s "$to" "$from"; fi
done

# CUDA's libraries from the toolkit; NCCL from the toolkit or PyTorch's wheel.
cuda_libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && cuda_libs="$cuda_libs:$d"
done
nccl=$(find / -xdev -name 'libnccl.so.2*' -not -path '*/proc/*' 2>/dev/null | head -1)
[[ -n "$nccl" ]] && cuda_libs="$cuda_libs:$(dirname "$nccl")"
export LD_LIBRARY_PATH="$here/lib$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TROUPE_SHARED_DIR="$here/shared"

log() { if [[ -n "${OUT:-}" ]]; then tee "$OUT/$1.log"; else cat; fi; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | log device
missing=$(ldd "$here/build/tests/test_cuda" "$here/build/bin/troupe" | grep 'not found' | sort -u)
[[ -n "$missing" ]] && { echo "run: libraries not found:"; echo "$missing"; exit 1; }

case "${1:-tests}" in
  tests)
    filter=${2:-*}
    "$here/build/tests/test_cuda" --gtest_filter="$filter" --gtest_color=no 2>&1 | log tests ;;
  bench)
    shift; "$here/build/bench/troupe_bench_cuda_decode" "$@" 2>&1 | log bench ;;
  exec)
    shift; "$@" 2>&1 | log exec ;;
  *) echo "run: tests | bench | exec CMD..." >&2; exit 2 ;;
esac
