#!/usr/bin/env bash
# The main job: install what is missing, build, train the seed model, evaluate it on held-out
# progressions and generate from it. TGC_STEPS overrides the model file's step count (the CPU
# interpreter takes about 14 s per seed step on two cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
tgc=build/tools/tgc
$tgc info
mkdir -p runs
steps=()
[ -n "${TGC_STEPS:-}" ] && steps=(--steps "$TGC_STEPS")
$tgc train models/seed.yaml "${steps[@]}" --save runs/seed.safetensors --log runs/seed.jsonl
$tgc eval runs/seed.safetensors
$tgc generate runs/seed.safetensors --prompt "5 12 19 26" --tokens 16
