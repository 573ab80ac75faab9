#!/bin/sh
# Runs a command that needs a shared model (../shared/models), for ctest tests that are not
# GoogleTest ones: the same rule as tests/shared_models.hpp. Where the model is missing the test
# is skipped (exit 77, the test's SKIP_RETURN_CODE) on a developer's machine and fails in CI (the
# CI environment variable set), because there a missing model is a broken setup.
#
#   run_with_shared_model.sh MODEL_NAME MODEL_PATH COMMAND [ARGS...]
set -eu
usage="usage: run_with_shared_model.sh MODEL_NAME MODEL_PATH COMMAND [ARGS...]"
name=${1:?$usage}
model=${2:?$usage}
shift 2
if [ ! -e "$model" ]; then
  case "${CI:-}" in
    "" | 0 | false)
      echo "$name not found at $model: skipped (in CI this fails)" >&2
      exit 77 ;;
    *)
      echo "$name not found at $model: CI needs ../shared/models" >&2
      exit 1 ;;
  esac
fi
exec "$@"
