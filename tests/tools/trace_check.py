#!/usr/bin/env python3
"""Checks a file against Chrome's Trace Event Format (the JSON Object Format that Perfetto and
chrome://tracing read) as far as tgc writes it: complete events ("X") and metadata events
("M"). Prints a summary, or the first violation and exits 1. Usage: trace_check.py FILE.json"""
import json
import numbers
import sys

def fail(message):
    print("invalid trace: " + message)
    sys.exit(1)

doc = json.load(open(sys.argv[1]))
if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
    fail("the top level is not an object with a traceEvents array")
if doc.get("displayTimeUnit", "ms") not in ("ms", "ns"):
    fail("displayTimeUnit is neither ms nor ns")
names = {}
complete = []
for i, e in enumerate(doc["traceEvents"]):
    if not isinstance(e, dict):
        fail(f"event {i} is not an object")
    ph = e.get("ph")
    for key, kind in (("name", str), ("ph", str), ("pid", int)):
        if not isinstance(e.get(key), kind):
            fail(f"event {i} has no {kind.__name__} {key}")
    if ph == "M":
        if e["name"] != "process_name" or not isinstance(e.get("args", {}).get("name"), str):
            fail(f"metadata event {i} does not name a process")
        names[e["pid"]] = e["args"]["name"]
    elif ph == "X":
        for key in ("ts", "dur"):
            if not isinstance(e.get(key), numbers.Real) or e[key] < 0:
                fail(f"complete event {i} has no non-negative {key}")
        if not isinstance(e.get("tid"), int):
            fail(f"complete event {i} has no integer tid")
        if "args" in e and not isinstance(e["args"], dict):
            fail(f"event {i}'s args is not an object")
        complete.append(e)
    else:
        fail(f"event {i} has phase {ph!r}, which tgc does not write")
if not complete:
    fail("no complete events")
unnamed = {e["pid"] for e in complete} - set(names)
if unnamed:
    fail(f"processes {sorted(unnamed)} have events but no name")
steps = sorted({e.get("args", {}).get("step") for e in complete})
print(f"valid: {len(complete)} events in {len(names)} process(es), steps {steps}")
