#!/usr/bin/env bash
# The test command: install what is missing, build, run every test, then fuzz the readers of
# untrusted text (scripts/fuzz.sh --ci: a fixed seed and input count). GPU tests (label gpu) skip
# themselves where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
scripts/build.sh "$@"
ctest --test-dir build --output-on-failure -j"$(nproc)"
scripts/fuzz.sh --ci
