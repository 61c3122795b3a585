#!/usr/bin/env bash
# The gpu-labelled tests on the GPU machine, in SHARDS processes at once (GTEST_TOTAL_SHARDS),
# each under a time limit, their output in OUTDIR/gpu-tests.txt with the failures first:
#   scripts/gpu-tests.sh [TESTS_BINARY] [OUTDIR] [SHARDS] [GTEST_FILTER]
# Defaults: build/tests/tgc_gpu_tests, ., 4, every test. The kernel headers and the models come
# from this checkout (TGC_SOURCE_DIR); NVRTC's cache from TGC_CACHE_DIR (/tmp/tgc-cache unless set).
set -euo pipefail
tests=${1:-build/tests/tgc_gpu_tests} out=${2:-.} shards=${3:-4} filter=${4:-*}
here=$(cd "$(dirname "$0")/.." && pwd)
export TGC_SOURCE_DIR=${TGC_SOURCE_DIR:-$here} TGC_CACHE_DIR=${TGC_CACHE_DIR:-/tmp/tgc-cache}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
pids=()
for ((i = 0; i < shards; ++i)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "${TGC_SHARD_SECONDS:-300}" "$tests" \
    --gtest_filter="$filter" > "$scratch/shard$i.txt" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1 # a failure, a crash or the time limit (124)
done
{
  echo "== failed"
  grep -h '^\[  FAILED  \] [A-Za-z]' "$scratch"/shard*.txt | sed 's/ ([0-9]* ms)$//' | sort -u || true
  for f in "$scratch"/shard*.txt; do # a crash or the time limit leaves no summary
    grep -q '^\[==========\] .* ran\.' "$f" || echo "$(basename "$f" .txt) ended in: $(grep '^\[ RUN' "$f" | tail -1)"
  done
  echo "== passed: $(cat "$scratch"/shard*.txt | grep -c '^\[       OK \]'), skipped: $(cat "$scratch"/shard*.txt | grep -c '^\[  SKIPPED \] [A-Za-z].* ms)$')"
  cat "$scratch"/shard*.txt
} > "$out/gpu-tests.txt"
head -20 "$out/gpu-tests.txt"
exit $status
