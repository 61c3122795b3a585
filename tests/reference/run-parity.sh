#!/usr/bin/env bash
# Runs the PyTorch peer next to tgc, on a machine with PyTorch and safetensors:
#   tests/reference/run-parity.sh TGC OUTDIR [TRAINED_CHECKPOINT]
# Writes OUTDIR/tiny-parity-losses.json and OUTDIR/llama-tiny-parity-losses.json (PyTorch's
# losses for 20 steps of tiny-parity and of the Llama block's llama-tiny-parity from tgc's
# initial weights; commit them as tests/reference/) and OUTDIR/generate.txt (greedy tokens of
# tgc and of PyTorch from the same trained checkpoint, which must agree).
set -euo pipefail
tgc=$1 out=$2 trained=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for model in tiny-parity llama-tiny-parity; do
  "$tgc" train "$here/$model.yaml" --device cpu --steps 0 --save "$scratch/$model-init.safetensors" > /dev/null
  python3 "$here/parity.py" "$scratch/$model-init.safetensors" --config "$here/$model.yaml" --steps 20 \
    --out "$out/$model-losses.json"
done
if [ -n "$trained" ]; then
  status=0
  for prompt in "5 12 19" "1 2 3 4" "60 62" "7 14 21 28 35 42 49 56" "3"; do
    ours=$("$tgc" generate "$trained" --prompt "$prompt" --tokens 24)
    theirs=$(python3 "$here/parity.py" "$trained" --generate "$prompt" --tokens 24)
    verdict=same
    [ "$ours" = "$theirs" ] || { verdict=DIFFERENT; status=1; }
    printf '%s\n  tgc:     %s\n  pytorch: %s\n  %s\n' "$prompt" "$ours" "$theirs" "$verdict"
  done | tee "$out/generate.txt"
  exit $status
fi
