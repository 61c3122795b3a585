#!/usr/bin/env bash
# The decode step's switches that are off until measured, each against the default in one call on
# the GPU machine (#41), from the same initial weights, alternating, ROUNDS rounds (1 unless set:
# about three minutes a round on an H100):
#   scripts/gpu-levers.sh [TGC] [OUTDIR]
# - TGC_SAMPLE_CLUSTER=1 (sample.cuh's sampleCluster) under --temperature 0.8 --top-p 0.95 at
#   gpt2-124m batch 1 and 32 and gpt-1.3b batch 1, beside greedy decoding.
# Each line: the switches, the model and batch, then tgc bench --generate's row; in
# OUTDIR/levers.txt. The standalone benches that judge the same levers kernel by kernel
# (tests/bench/sample_grid.cu, sample_parts.cu) are built with
# nvcc where it is installed and run beside this.
set -euo pipefail
tgc=${1:-build/tools/tgc} out=${2:-.}
here=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# gen MODEL BATCH [VAR=VALUE ...] [-- FLAGS ...]: one bench row, prefixed with what it ran.
gen() {
  local model=$1 batch=$2 vars=() flags=()
  shift 2
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1") && shift; done
  [ $# -gt 0 ] && shift && flags=("$@")
  local init="$scratch/$model.safetensors"
  [ -f "$init" ] || "$tgc" train "$here/models/$model.yaml" --device cuda --steps 0 --save "$init" > /dev/null
  local row
  row=$(env "${vars[@]}" "$tgc" bench "$here/models/$model.yaml" --generate --device cuda --precisions bf16 \
    --weights "$init" --batch "$batch" --prompt-length 16 --tokens 240 --bench-steps 5 "${flags[@]}" | tail -1)
  echo "${vars[*]:-default} ${flags[*]:-greedy} | $model batch $batch | $row"
}
{
  for ((round = 1; round <= ${ROUNDS:-1}; ++round)); do
    echo "== round $round"
    for case in gpt2-124m:1 gpt2-124m:32 gpt-1.3b:1; do
      IFS=: read -r model batch <<< "$case"
      gen "$model" "$batch"
      gen "$model" "$batch" TGC_SAMPLE_CLUSTER=0 -- --temperature 0.8 --top-p 0.95
      gen "$model" "$batch" TGC_SAMPLE_CLUSTER=1 -- --temperature 0.8 --top-p 0.95
    done
  done
} 2>&1 | tee "$out/levers.txt"
