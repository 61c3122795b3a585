#!/usr/bin/env bash
# tgc bench --generate and its PyTorch peer (tests/reference/generate_peer.py: static KV cache,
# torch.compile) side by side on the GPU machine, from the same initial weights:
#   scripts/bench-generate.sh [TGC] [OUTDIR] [MODEL:BATCH[:PROMPT] ...]
# Default cases: gpt2-124m at batch 1 and 32, gpt-1.3b at batch 1 and 8, and gpt2-124m's prefill
# of 32 prompts of 1000 tokens. Each case: PROMPT-token prompts (16 unless given), 240 new tokens
# (24 after prompts of more than 16), greedy, bf16; tgc's table row, then the peer's line, in
# OUTDIR/generate.txt.
# FLAGS (environment) go to tgc's bench alone (e.g. FLAGS="--temperature 0.8 --top-p 0.95").
set -euo pipefail
tgc=${1:-build/tools/tgc} out=${2:-.}
shift $(($# < 2 ? $# : 2))
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(gpt2-124m:1 gpt2-124m:32 gpt-1.3b:1 gpt-1.3b:8 gpt2-124m:32:1000)
here=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
{
  for c in "${cases[@]}"; do
    IFS=: read -r model batch prompt <<< "$c"
    prompt=${prompt:-16} tokens=$([ "${prompt}" -gt 16 ] && echo 24 || echo 240) init="$scratch/$model.safetensors"
    [ -f "$init" ] || "$tgc" train "$here/models/$model.yaml" --device cuda --steps 0 --save "$init" > /dev/null
    echo "== $model, batch $batch, prompts of $prompt"
    # (${FLAGS-} unquoted: several flags, split on spaces.)
    # shellcheck disable=SC2086
    "$tgc" bench "$here/models/$model.yaml" --generate --device cuda --precisions bf16 --weights "$init" \
      --batch "$batch" --prompt-length "$prompt" --tokens "$tokens" --bench-steps 5 ${FLAGS-} | tail -1
    python3 "$here/tests/reference/generate_peer.py" "$init" --batch "$batch" --prompt-length "$prompt" --tokens "$tokens" \
      --compile | tail -1
  done
} 2>&1 | tee "$out/generate.txt"
