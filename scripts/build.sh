#!/usr/bin/env bash
# Configures and builds tgc into build/ (Release). Extra arguments go to cmake's configure step,
# e.g. scripts/build.sh -DTGC_CUDA=OFF. TGC_BUILD_TARGETS builds only those targets (the main
# job builds the runner alone, not the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
# One translation unit a source unless the arguments ask for a unity build (scripts/test.sh).
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=OFF "$@"
targets=()
[ -n "${TGC_BUILD_TARGETS:-}" ] && targets=(--target ${TGC_BUILD_TARGETS})
cmake --build build -j"$(nproc)" "${targets[@]}"
