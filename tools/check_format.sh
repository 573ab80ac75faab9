#!/usr/bin/env bash
# Checks (or with --fix, applies) the code style of .clang-format on every C++ and CUDA source
# of the repository. The ctest test `format` runs the check; `make format` runs the fix.
set -euo pipefail

# Usage: check_format.sh [ROOT] [--fix]; ROOT defaults to the repository holding this script.
root=$(cd "$(dirname "$0")/.." && pwd)
mode=check
for arg in "$@"; do
  if [[ $arg == --fix ]]; then mode=fix; else root=$arg; fi
done
cd "$root"

if ! command -v clang-format >/dev/null; then
  echo "check_format: clang-format is not installed (tools/setup.sh installs it)" >&2
  exit 1
fi

# The sources git knows (a clean clone, CI); outside a git checkout, the tree without build output.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh' | grep -v '^tests/oracles/')
else
  mapfile -t files < <(find . -path ./build -prune -o -path ./tests/oracles -prune -o \
    -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print)
fi

if [[ $mode == fix ]]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 64 clang-format -i
  echo "check_format: formatted ${#files[@]} files"
  exit 0
fi

# --dry-run -Werror names each file and line that differs; the summary says how to mend them.
if ! printf '%s\0' "${files[@]}" | xargs -0 -n 64 clang-format --dry-run -Werror 2>/tmp/check_format.$$; then
  grep -m 20 'error:' /tmp/check_format.$$ >&2 || true
  bad=$(grep -c 'error:' /tmp/check_format.$$ || true)
  rm -f /tmp/check_format.$$
  echo "check_format: ${bad} lines do not follow .clang-format; run \`make format\` (tools/check_format.sh --fix)" >&2
  exit 1
fi
rm -f /tmp/check_format.$$
echo "check_format: ${#files[@]} files follow .clang-format"
