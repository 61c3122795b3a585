#!/usr/bin/env bash
# Fuzzes the readers of untrusted input with libFuzzer (clang, from Debian): the model file
# reader, the IR parser, the checkpoint reader, tgc report's log and bench readers and the
# tokenizer's text (timed runs also the tokenizer file and a Hugging Face config.json), each
# for SECONDS (default 60), starting from the seed corpora in
# tests/fuzz/corpus and keeping what they find in build-fuzz/corpus-*. Built with
# AddressSanitizer and UndefinedBehaviorSanitizer; a finding stops with its input saved and a
# non-zero exit. First the tests of the layers the fuzzers build run under the same sanitizers.
# --ci: a fixed seed and a fixed number of inputs from the seed corpora alone (the same inputs
# every run: about 40 seconds of fuzzing, a smoke test that keeps CI within its 10 minutes;
# longer runs find more), as scripts/test.sh runs it.
#   scripts/fuzz.sh [SECONDS | --ci]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
limit=(-max_total_time="$seconds")
if [ "$seconds" = "--ci" ]; then
  limit=(-seed=1 -runs=50000)
fi
scripts/setup.sh --fuzz
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
# (clang for C too: GCC's C runtime libraries would bring GCC's ASan next to clang's.)
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang-16 -DCMAKE_CXX_COMPILER=clang++-16 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTGC_CUDA=OFF -DTGC_FUZZ=ON -DCMAKE_CXX_FLAGS="$flags" > /dev/null
readers="model ir checkpoint report tokenizer"
# Timed runs fuzz two more readers: the tokenizer file and a Hugging Face config.json (CI's
# smoke test leaves them out, for its 10 minutes).
[ "$seconds" = "--ci" ] || readers="$readers tokenizer_file hf_config"
targets=()
for reader in $readers; do targets+=(tgc_fuzz_$reader); done
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]}" tgc_sanitized_tests
# The support, IR and model tests under the same sanitizers (a finding stops here).
echo "sanitizers: the support, IR and model tests (AddressSanitizer, UndefinedBehaviorSanitizer)"
UBSAN_OPTIONS=print_stacktrace=1 build-fuzz/tgc_sanitized_tests --gtest_brief=1
for reader in $readers; do
  corpus=build-fuzz/corpus-$reader
  rm -rf "$corpus" && mkdir -p "$corpus" # --ci: what earlier runs found would change the inputs
  [ "$seconds" = "--ci" ] || cp -n build-fuzz/kept-$reader/* "$corpus"/ 2>/dev/null || true
  cp tests/fuzz/corpus/${reader//_/-}/* "$corpus"/
  runs=("${limit[@]}")
  # (--ci: the checkpoint reader's inputs cost 4x the others'.)
  [ "$seconds" = "--ci" ] && [ "$reader" = checkpoint ] && runs=(-seed=1 -runs=25000)
  echo "fuzz: the $reader reader (${runs[*]})"
  if ! build-fuzz/tgc_fuzz_$reader "${runs[@]}" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix=build-fuzz/finding-$reader- "$corpus" > build-fuzz/fuzz-$reader.log 2>&1; then
    tail -40 build-fuzz/fuzz-$reader.log
    echo "fuzz: a finding in the $reader reader, its input in build-fuzz/finding-$reader-*"
    exit 1
  fi
  tail -1 build-fuzz/fuzz-$reader.log
  mkdir -p build-fuzz/kept-$reader && cp -n "$corpus"/* build-fuzz/kept-$reader/ 2>/dev/null || true
done
