#!/usr/bin/env bash
# The test command: install what is missing, build, run every test, then fuzz the readers of
# untrusted text (scripts/fuzz.sh --ci: a fixed seed and input count). GPU tests (label gpu) are
# built where nvidia-smi finds a GPU, and skip themselves where it finds none.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
# The GPU tests only where a GPU is (elsewhere they would skip): CI's two cores build the rest.
gpu=-DTGC_GPU_TESTS=ON
command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 || gpu=-DTGC_GPU_TESTS=OFF
# A unity build (ten sources a translation unit: what they include parsed once, not ten times)
# shortens CI's compile; scripts/build.sh alone builds one unit a source, where a source that
# does not include what it uses still fails.
scripts/build.sh "$gpu" -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=10 "$@"
ctest --test-dir build --output-on-failure -j"$(nproc)"
scripts/fuzz.sh --ci
