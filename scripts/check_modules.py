#!/usr/bin/env python3
"""The module map in docs/DESIGN.md, checked against the includes (issue 26).

DESIGN.md states the layering in one line, e.g.
    cli → {train, report} → {guard, ..., distributed → optim} → config → common
A module may include a module of a lower layer. Modules in one pair of braces do not include each
other, except where the line draws an arrow between them inside the braces. Every module under
src/ must appear in the line. Usage: check_modules.py [SRC_DIR [DESIGN_MD]]; exit 1 on a violation.
"""
import os
import re
import sys


def parse_layers(design):
    line = next((l.strip() for l in open(design, encoding="utf-8")
                 if l.strip().startswith("cli →")), None)
    if line is None:
        sys.exit(f"check_modules: {design} has no layering line starting with 'cli →'")
    layers, exceptions = [], set()
    # Split on the arrows outside braces.
    depth, part, parts = 0, "", []
    for ch in line:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "→" and depth == 0:
            parts.append(part)
            part = ""
        else:
            part += ch
    parts.append(part)
    for p in parts:
        p = p.strip().strip("{}")
        names = []
        for item in p.split(","):
            chain = [n.strip() for n in item.split("→")]
            for a, b in zip(chain, chain[1:]):
                exceptions.add((a, b))
            names += chain
        layers.append(names)
    return {m: i for i, names in enumerate(layers) for m in names}, exceptions


def includes(src):
    edges = {}
    for root, _, files in os.walk(src):
        rel = os.path.relpath(root, src).split(os.sep)[0]
        if rel == ".":
            continue
        for f in files:
            path = os.path.join(root, f)
            for n, text in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                m = re.match(r'\s*#\s*include\s+"([a-z_]+)/', text)
                if m and m.group(1) != rel:
                    edges.setdefault((rel, m.group(1)), []).append(f"{path}:{n}")
    return edges


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "src")
    design = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "docs", "DESIGN.md")
    layer, exceptions = parse_layers(design)
    bad = []
    modules = {d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d))}
    for m in sorted(modules - set(layer)):
        bad.append(f"src/{m}/ is not in {design}'s module map")
    for (a, b), where in sorted(includes(src).items()):
        if a not in layer or b not in layer:
            continue
        if layer[b] > layer[a] or (a, b) in exceptions:
            continue
        bad.append(f"{where[0]}: {a} includes {b} ({len(where)} include(s)), which the module map "
                   f"in {design} does not allow")
    for b in bad:
        print(b)
    if bad:
        print("check_modules: fix the include or the module map in docs/DESIGN.md")
        return 1
    print(f"modules: {len(modules)} modules, every include within the module map")
    return 0


if __name__ == "__main__":
    sys.exit(main())
