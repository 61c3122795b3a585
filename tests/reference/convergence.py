#!/usr/bin/env python3
"""tgc's losses next to the PyTorch peer's over the same steps and data.

  tgc train M.yaml --precision P --log tgc.jsonl
  python3 tests/reference/parity.py INIT.safetensors --config M.yaml --bench --precision P \\
      --steps N --warmup 0 --losses peer.json
  python3 tests/reference/convergence.py tgc.jsonl peer.json [--within 0.02]

Prints both losses at a few steps, the last, and the mean of the last 50, and says whether the
last loss and that mean are within the given relative distance of the peer's (exit 1 if not).
Either file may be of either kind (two peers' runs, or two of tgc's).
"""
import argparse
import json
import sys


def read_losses(path):
    """A tgc --log file (a JSON record a line), or a peer's --losses file (one JSON object)."""
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)["losses"]
    except (ValueError, KeyError, TypeError):
        pass
    losses = {}
    for line in text.splitlines():
        record = json.loads(line)
        if "step" in record and "loss" in record:
            losses[record["step"]] = record["loss"]
    return [losses[s] for s in sorted(losses)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tgc")
    parser.add_argument("peer")
    parser.add_argument("--within", type=float, default=0.02)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    ours, theirs = read_losses(args.tgc), read_losses(args.peer)
    if len(ours) != len(theirs) or not ours:
        print(f"error: {args.tgc} has {len(ours)} steps, {args.peer} {len(theirs)}", file=sys.stderr)
        return 2
    n = len(ours)
    marks = sorted({1, 10, 50, 100, 200, n} & set(range(1, n + 1)))
    print(f"{args.label} step: " + "  ".join(f"{s}: tgc {ours[s - 1]:.4f} torch {theirs[s - 1]:.4f}" for s in marks))
    tail = min(50, n)
    mean_ours, mean_theirs = sum(ours[-tail:]) / tail, sum(theirs[-tail:]) / tail
    last = abs(ours[-1] - theirs[-1]) / abs(theirs[-1])
    mean = abs(mean_ours - mean_theirs) / abs(mean_theirs)
    ok = last <= args.within and mean <= args.within
    print(f"{args.label} last: tgc {ours[-1]:.4f} torch {theirs[-1]:.4f} ({100 * last:.2f}% apart); mean of the last "
          f"{tail}: tgc {mean_ours:.4f} torch {mean_theirs:.4f} ({100 * mean:.2f}% apart): "
          f"{'within' if ok else 'NOT within'} {100 * args.within:g}%")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
