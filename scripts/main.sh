#!/usr/bin/env bash
# The main job: the seed tutorial's workflow (Transformer Engine's FP8 tutorial, ../shared/seed)
# on tgc. Installs what is missing, builds, then on the seed model (models/seed.yaml):
#   1. tgc info: the GPU and what it supports;
#   2. trains it as the tutorial does: every eligible linear layer in FP8 under delayed scaling
#      (--precision fp8), logging the FP8 scaling state;
#   3. tgc bench: the forward, backward and optimizer step in fp32, bf16 and fp8 side by side
#      (and auto: FP8 where it measures faster), step time and peak memory;
#   4. tgc inspect: the scales and amax histories of the checkpoint;
#   5. tgc eval and tgc generate from it;
#   6. tgc report: runs/<model>.html, the losses and the FP8 scale and amax charts.
# Without a GPU the same runs on the tiny model (models/tiny.yaml: the same task, FP8 emulated
# bit for bit on the CPU interpreter, a few minutes on two cores): the seed model on the CPU
# takes about 14 s a step. TGC_MODEL picks the model file, TGC_STEPS overrides its step count,
# TGC_PRECISION the training recipe (default fp8), TGC_BIN a tgc built before (no setup, no build:
# a machine without the packages, such as a GPU host that reaches no mirror).
set -euo pipefail
cd "$(dirname "$0")/.."
tgc=${TGC_BIN:-build/tools/tgc}
if [ -z "${TGC_BIN:-}" ]; then
  scripts/setup.sh
  TGC_BUILD_TARGETS=tgc scripts/build.sh
fi
echo "== 1. the device"
$tgc info
model=${TGC_MODEL:-}
bench=(--bench-steps 50 --warmup 10)
if [ -z "$model" ]; then
  if $tgc info | grep -q '^GPU: none'; then
    model=models/tiny.yaml
    bench=(--bench-steps 10 --warmup 2)
    echo "main: no GPU here, so the tiny model runs on the CPU interpreter, FP8 emulated (a few minutes);"
    echo "main: TGC_MODEL=models/seed.yaml scripts/main.sh runs the seed model on the CPU (hours)"
  else
    model=models/seed.yaml
  fi
fi
name=$(basename "$model" .yaml)
precision=${TGC_PRECISION:-fp8}
mkdir -p runs
steps=()
[ -n "${TGC_STEPS:-}" ] && steps=(--steps "$TGC_STEPS")
echo "== 2. training in $precision (every eligible linear layer in FP8, delayed scaling)"
$tgc train "$model" "${steps[@]}" --precision "$precision" --save "runs/$name.safetensors" \
  --log "runs/$name.jsonl" --log-fp8-every 10
echo "== 3. fp32, bf16 and fp8 side by side: step time and peak memory"
$tgc bench "$model" "${bench[@]}" --json "runs/$name.bench.json"
echo "== 4. the FP8 scaling state: scales and amax histories"
$tgc inspect "runs/$name.safetensors"
echo "== 5. evaluation and generation"
$tgc eval "runs/$name.safetensors"
$tgc generate "runs/$name.safetensors" --prompt "5 12 19 26" --tokens 16
echo "== 6. the report"
$tgc report "runs/$name.jsonl" --bench "runs/$name.bench.json" -o "runs/$name.html"
