#!/usr/bin/env bash
# Fuzzes the readers of untrusted text with libFuzzer (clang, from Debian): the model file
# reader and the IR parser, each for SECONDS (default 60), starting from the seed corpora in
# tests/fuzz/corpus and keeping what they find in build-fuzz/corpus-*. Built with
# AddressSanitizer and UndefinedBehaviorSanitizer; a finding stops with its input saved.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
scripts/setup.sh --fuzz
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
# (clang for C too: GCC's C runtime libraries would bring GCC's ASan next to clang's.)
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang-16 -DCMAKE_CXX_COMPILER=clang++-16 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTGC_CUDA=OFF -DTGC_FUZZ=ON -DCMAKE_CXX_FLAGS="$flags" > /dev/null
cmake --build build-fuzz -j"$(nproc)" --target tgc_fuzz_model tgc_fuzz_ir
for reader in model ir; do
  corpus=build-fuzz/corpus-$reader
  mkdir -p "$corpus"
  cp -n tests/fuzz/corpus/$reader/* "$corpus"/
  echo "fuzz: the $reader reader for $seconds s"
  build-fuzz/tgc_fuzz_$reader -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix=build-fuzz/finding-$reader- "$corpus" 2>&1 | tail -3
done
