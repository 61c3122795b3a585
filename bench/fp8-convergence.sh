#!/usr/bin/env bash
# FP8's recipes against BF16 (and fp32) on real text, the same seed, init and batches:
#   bench/fp8-convergence.sh CORPUS OUTDIR [RUN ...]
# Each RUN is NAME=FLAGS, trained as `tgc train models/gpt2-124m-bytes.yaml --data CORPUS
# FLAGS` (400 steps of 32 x 512 bytes unless FLAGS or $STEPS say otherwise; $SEED the seed,
# $TGC the runner). Default runs: bf16 and fp8 under delayed, current and mixed scaling, every
# linear layer in FP8. Each run's log goes to OUTDIR/NAME.jsonl (and .txt); the table printed
# has the last loss, the mean of the last 50 and its distance from the first run's.
set -euo pipefail
corpus=${1:?a text file to train on} out=${2:?a folder for the logs}
shift 2
tgc=${TGC:-build/tools/tgc}
steps=${STEPS:-400} seed=${SEED:-1234}
runs=("$@")
if [ ${#runs[@]} -eq 0 ]; then
  runs=("bf16=--precision bf16"
        "fp8-delayed=--precision fp8 --fp8-scaling delayed"
        "fp8-current=--precision fp8 --fp8-scaling current"
        "fp8-mixed=--precision fp8 --fp8-scaling mixed")
fi
mkdir -p "$out"
for run in "${runs[@]}"; do
  name=${run%%=*} flags=${run#*=}
  # shellcheck disable=SC2086 # FLAGS is a list of flags
  "$tgc" train models/gpt2-124m-bytes.yaml --data "$corpus" --steps "$steps" --seed "$seed" \
    --fp8-min-dim 0 --log-every 50 $flags --log "$out/$name.jsonl" > "$out/$name.txt" 2>&1 ||
    { echo "$name: tgc train failed (rc $?), see $out/$name.txt" >&2; exit 1; }
done
python3 - "$out" "${runs[@]}" <<'EOF'
import json, statistics, sys
out, runs = sys.argv[1], [r.split("=", 1)[0] for r in sys.argv[2:]]
base = None
print(f"{'run':<16} {'last loss':>9} {'mean of last 50':>15} {'against ' + runs[0]:>16} {'median step ms':>14}")
for name in runs:
    records = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    steps = [r for r in records if "loss" in r and "step" in r]
    mean = statistics.fmean(r["loss"] for r in steps[-50:])
    ms = statistics.median(r["step_ms"] for r in steps[len(steps) // 2:])
    base = mean if base is None else base
    print(f"{name:<16} {steps[-1]['loss']:>9.4f} {mean:>15.4f} {mean - base:>+16.4f} {ms:>14.2f}")
EOF
