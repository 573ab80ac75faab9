#!/usr/bin/env bash
# Packs what a lent GPU machine needs to run Troupe's CUDA tests and benchmarks into .gpu/ (kept
# out of git through .git/info/exclude), for the `device` tool's `carry`. The GPU machines have
# CUDA, NCCL and PyTorch but none of the Debian libraries Troupe links (CAF, ZeroMQ, spdlog, ...),
# and nothing can be installed there; CUDA code compiles here (sm_80 and sm_90), so the binaries
# are built here and travel, compressed, with the libraries they need. tools/gpu/run.sh
# unpacks and runs them there.
#
#   tools/gpu/bundle.sh [BUILD_DIR]      # default: build (configured with CUDA, built)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
dest="$root/.gpu"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

grep -qx '/.gpu/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >>"$root/.git/info/exclude"
[[ -x "$build/tests/test_cuda" ]] || { echo "bundle: $build/tests/test_cuda is not built (a build with nvcc: ninja -C $build test_cuda troupe troupe_bench_cuda_decode)" >&2; exit 1; }
[[ -x "$build/bench/troupe_bench_cuda_decode" ]] || echo "bundle: no $build/bench/troupe_bench_cuda_decode: run.sh bench will not work (ninja -C $build troupe_bench_cuda_decode)" >&2
shared=$(sed -n 's/^TROUPE_SHARED_DIR:PATH=//p' "$build/CMakeCache.txt")
shared=$(cd "$shared" && pwd)

mkdir -p "$out/build/bin" "$out/build/tests" "$out/build/bench" "$out/lib" "$out/shared/models"
cp "$build/bin/troupe" "$build/bin/troupe-bench" "$out/build/bin/"
cp "$build/tests/test_cuda" "$out/build/tests/"
for b in "$build"/bench/troupe_bench_*; do [[ -x "$b" ]] && cp "$b" "$out/build/bench/"; done
cp -r "$shared/models/stories260K" "$out/shared/models/"

# Every library the binaries resolve here except the C runtime and CUDA's own (the GPU machine
# has newer ones of both, matched to its driver).
{
  for f in "$out"/build/bin/* "$out"/build/tests/* "$out"/build/bench/*; do ldd "$f"; done
} | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) continue ;;
    libcuda*|libcublas*|libcudart*|libnccl*|libnvrtc*|libnvJitLink*) continue ;;
  esac
  cp -L "$lib" "$out/lib/"
done

# The paths the tests were built with (TROUPE_BINARY_DIR, TROUPE_SHARED_DIR): run.sh makes them
# point at the bundle there.
printf 'built_binary_dir=%q\nbuilt_shared_dir=%q\n' "$build" "$shared" >"$out/paths.env"
# Compressed: the libraries alone are above what one call may carry uncompressed.
rm -rf "$dest" && mkdir -p "$dest"
tar -C "$out" -cJf "$dest/troupe-gpu.tar.xz" .
cp "$root/tools/gpu/run.sh" "$dest/"
du -sh "$dest" | awk '{print "bundle: " $1 " in .gpu/ (the device tool carries at most 64 MiB)"}'
