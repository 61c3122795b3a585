#!/usr/bin/env bash
# The main job: install what is missing, build, train, evaluate on held-out progressions and
# generate. On a GPU it trains the seed model (models/seed.yaml). Without one it trains the
# tiny model (models/tiny.yaml: the same task and workflow, about a minute on two cores): the
# seed model on the CPU interpreter takes about 14 s a step, an hour and a half in all.
# TGC_MODEL picks the model file, TGC_STEPS overrides its step count.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
TGC_BUILD_TARGETS=tgc scripts/build.sh
tgc=build/tools/tgc
$tgc info
model=${TGC_MODEL:-}
if [ -z "$model" ]; then
  if $tgc info | grep -q '^GPU: none'; then
    model=models/tiny.yaml
    echo "main: no GPU here, so the tiny model trains on the CPU interpreter (about a minute);"
    echo "main: TGC_MODEL=models/seed.yaml scripts/main.sh trains the seed model on the CPU (about 90 minutes)"
  else
    model=models/seed.yaml
  fi
fi
name=$(basename "$model" .yaml)
mkdir -p runs
steps=()
[ -n "${TGC_STEPS:-}" ] && steps=(--steps "$TGC_STEPS")
$tgc train "$model" "${steps[@]}" --save "runs/$name.safetensors" --log "runs/$name.jsonl"
$tgc eval "runs/$name.safetensors"
$tgc generate "runs/$name.safetensors" --prompt "5 12 19 26" --tokens 16
