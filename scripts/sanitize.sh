#!/usr/bin/env bash
# The CPU tests under AddressSanitizer and UndefinedBehaviorSanitizer (GCC's, no other package):
# a CPU-only build in build-sanitize/, then every CPU test but the three long training ones.
# About 10 minutes of build and 3 of tests on two cores, so it is not part of CI's 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTGC_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build build-sanitize -j"$(nproc)" --target tgc tgc_tests
# Not the test that caps the address space with ulimit -v (ASan reserves terabytes of it).
UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-sanitize --output-on-failure -j"$(nproc)" -L cpu \
  -E "TinyModelWithin|TinyModelLearns|MatchesPyTorch|address-space-limit"
