#!/usr/bin/env python3
"""The size rules of the code (README, "How the code is kept"): no source or test file over
800 lines, no function over 120. A function is a line that opens a body after a parameter
list, `name(...) {` (or whose parameter list ends there), up to the line that closes it at the
same indentation. Prints each breach as file:line and exits 1 if there is any."""
import os, re, sys

MAX_FILE, MAX_FUNCTION = 800, 120
FOLDERS = ["support", "ir", "models", "transforms", "backends", "driver", "app", "tools", "tests"]
SUFFIXES = (".cpp", ".h", ".cuh", ".cu", ".def")
OPENS = re.compile(r"^(\s*)(?!(if|for|while|switch|do|else|namespace|struct|class|enum|union|return)\b)"
                   r"[^;{}]*\)\s*(const)?\s*(override)?\s*(noexcept)?\s*(->\s*[^{]+)?\{\s*$")

def functions(lines):
    """(first line, length) of each function body."""
    i = 0
    while i < len(lines):
        m = OPENS.match(lines[i])
        if not m or lines[i].lstrip().startswith(("//", "#", "*")):
            i += 1
            continue
        # The signature may start lines above (a wrapped parameter list): count from its start,
        # whose indentation the closing brace has.
        start = i
        lambda_ = lines[i].lstrip().startswith("[") # a lambda argument: its own indentation closes it
        while not lambda_ and start > 0 and lines[start - 1].strip() and not lines[start - 1].rstrip().endswith((";", "}", "{", "*/", ":")) \
                and not lines[start - 1].lstrip().startswith(("//", "#")):
            start -= 1
        indent = re.match(r"^(\s*)", lines[start]).group(1)
        end = i + 1
        while end < len(lines) and not re.match("^" + indent + r"\}", lines[end]):
            end += 1
        yield start + 1, end - start + 1
        i = end + 1

def main(root):
    breaches = []
    for folder in FOLDERS:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if not name.endswith(SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
                if len(lines) - 1 > MAX_FILE:
                    breaches.append(f"{rel}:1: {len(lines) - 1} lines (at most {MAX_FILE})")
                for line, length in functions(lines):
                    if length > MAX_FUNCTION:
                        breaches.append(f"{rel}:{line}: a function of {length} lines (at most {MAX_FUNCTION})")
    for b in breaches:
        print(b)
    print(f"check_sizes: {len(breaches)} breaches")
    return 1 if breaches else 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")))
