#!/usr/bin/env python3
"""BENCHMARKS.md's training table from one device call's outputs, not by hand.

    scripts/bench-table.py TGC.json [TGC.json ...] [--peer MODEL=PEER.log ...]

TGC.json: `tgc bench MODEL --json FILE` (one or more recipes of a model). PEER.log: what
`tests/reference/parity.py --bench [--compile]` printed for MODEL (its `pytorch ...: median ...`
lines, torch.compile and eager, in any order; other lines are skipped). Prints a Markdown table: a
row per model and tgc recipe, with the peers of the same precision and tgc's ratio to
torch.compile (the peer's median step over tgc's). A peer that did not run is "-".
"""
import argparse
import json
import re
import sys

PEER_LINE = re.compile(
    r"pytorch (?P<precision>\w+)\s+(?P<mode>torch\.compile|eager)[^:]*: median (?P<median>[\d.]+) ms, "
    r"mean (?P<mean>[\d.]+) ms, (?P<tokens>\d+) tokens/s, peak memory (?P<memory>\d+) MiB")


def gib(mib):
    return f"{mib / 1024:.1f} GiB"


def tokens(per_second):
    return f"{per_second / 1000:.1f}k tok/s"


def read_peers(specs):
    """{(model, precision, mode): {median, tokens, memory}} from MODEL=FILE arguments."""
    peers = {}
    for spec in specs:
        model, sep, path = spec.partition("=")
        if not sep or not model or not path:
            sys.exit(f"bench-table.py: --peer takes MODEL=FILE, got '{spec}'")
        try:
            text = open(path, encoding="utf-8").read()
        except OSError as e:
            sys.exit(f"bench-table.py: {path}: {e.strerror}")
        found = 0
        for line in text.splitlines():
            m = PEER_LINE.search(line)
            if m:
                mode = "compile" if m["mode"] == "torch.compile" else "eager"
                peers[(model, m["precision"], mode)] = {
                    "median": float(m["median"]), "tokens": int(m["tokens"]), "memory": int(m["memory"])}
                found += 1
        if not found:
            sys.exit(f"bench-table.py: {path}: no 'pytorch ...: median ...' line (parity.py --bench's)")
    return peers


def read_tgc(paths):
    rows = []
    for path in paths:
        try:
            results = json.load(open(path, encoding="utf-8"))["results"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"bench-table.py: {path}: not a `tgc bench --json` file ({e})")
        rows.extend(results)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tgc", nargs="+", help="tgc bench --json files")
    parser.add_argument("--peer", action="append", default=[], help="MODEL=FILE: parity.py --bench's output")
    args = parser.parse_args()
    peers = read_peers(args.peer)
    print("| model | recipe | tgc | torch.compile | eager | tgc / torch.compile |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in read_tgc(args.tgc):
        model, recipe = r["model"], r["recipe"]
        cells = [model, recipe,
                 f"{r['median_ms']:.2f} ms, {tokens(r['tokens_per_s'])}, {gib(r['memory_mib'])}"]
        compile_peer = peers.get((model, recipe, "compile"))
        for mode in ("compile", "eager"):
            p = peers.get((model, recipe, mode))
            cells.append(f"{p['median']:.2f} ms, {tokens(p['tokens'])}, {gib(p['memory'])}" if p else "-")
        cells.append(f"{compile_peer['median'] / r['median_ms']:.2f}x" if compile_peer else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
