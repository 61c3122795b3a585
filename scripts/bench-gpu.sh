#!/usr/bin/env bash
# tgc bench and its PyTorch peer side by side, on the GPU machine (PyTorch and safetensors there):
#   scripts/bench-gpu.sh [TGC] [MODEL] [OUTDIR]
# For each precision, tgc's table (fp32, bf16, fp8: every legal linear layer in FP8, and auto:
# FP8 where it measures faster), then the peer from tgc's initial weights with the same batches,
# optimizer and steps (bf16 also under torch.compile; fp8 with every linear layer but the head
# in FP8, as tgc's fp8).
set -euo pipefail
tgc=${1:-build/tools/tgc} model=${2:-models/seed.yaml} out=${3:-.}
steps=50 warmup=10
here=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$tgc" train "$model" --device cpu --steps 0 --save "$scratch/init.safetensors" > /dev/null
peer() {
  python3 "$here/tests/reference/parity.py" "$scratch/init.safetensors" --config "$model" --bench \
    --steps "$steps" --warmup "$warmup" "$@"
}
{
  "$tgc" bench "$model" --device cuda --precisions fp32,bf16,fp8,auto --bench-steps "$steps" --warmup "$warmup"
  peer --precision fp32
  peer --precision bf16
  peer --precision bf16 --compile
  peer --precision fp8
} 2>&1 | tee "$out/bench.txt"
