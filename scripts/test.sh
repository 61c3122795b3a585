#!/usr/bin/env bash
# The test command: install what is missing, build, run every test. GPU tests (label gpu) skip
# themselves where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
scripts/build.sh "$@"
ctest --test-dir build --output-on-failure -j"$(nproc)"
