#!/usr/bin/env bash
# Configures and builds tgc into build/ (Release). Extra arguments go to cmake's configure step,
# e.g. scripts/build.sh -DTGC_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$(nproc)"
