#!/usr/bin/env python3
"""Checks that every `#include "..."` under src/ follows the layer table of
docs/architecture.md: a file may include headers of its own folder, of the folders its
layer's row lists under "may include", and include/ (the public API). An include that
points anywhere else (up a layer, or sideways to a layer not listed) is reported with its
file, line and the row's list, and the exit status is 1.

    scripts/check-layers.py [--root DIR]

The table is the single source: a new folder under src/ needs a row there (a file in a
folder without one is reported too). Quoted includes that name no file under src/ or
include/ (a generated header such as build_info.h, a system header written with quotes)
are not layers and are skipped. Used by tests/py/test_layers.py.
"""
import argparse
import os
import re
import sys

SOURCE = re.compile(r"\.(c|h|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
ROW = re.compile(r"^\|\s*`src/([a-z0-9_/]+)/`\s*\|(.*)\|(.*)\|\s*$")
NAME = re.compile(r"`([a-z0-9_/]+)`")


def read_table(doc):
    """{layer: set of layers it may include} from the table of docs/architecture.md."""
    table = {}
    with open(doc, encoding="utf-8") as f:
        for line in f:
            m = ROW.match(line)
            if m:
                table[m.group(1)] = set(NAME.findall(m.group(3)))
    if not table:
        raise SystemExit(f"{doc}: no layer table (rows like | `src/NAME/` | owns | may include |)")
    for layer, allowed in table.items():
        for a in allowed:
            if a not in table:
                raise SystemExit(f"{doc}: the row of src/{layer}/ lists `{a}`, which has no row")
    return table


def layer_of(path, table):
    """The longest table layer that path (relative to src/) lies in, or None."""
    best = None
    for layer in table:
        if path.startswith(layer + "/") and (best is None or len(layer) > len(best)):
            best = layer
    return best


def check(root):
    """Returns the list of violations (strings) in root's src/."""
    table = read_table(os.path.join(root, "docs", "architecture.md"))
    src = os.path.join(root, "src")
    bad = []
    for dirpath, _, files in os.walk(src):
        for name in sorted(files):
            if not SOURCE.search(name):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            me = layer_of(rel, table)
            if me is None:
                bad.append(f"src/{rel}: its folder has no row in docs/architecture.md's layer table")
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for m in INCLUDE.finditer(text):
                inc = m.group(1)
                if os.path.exists(os.path.join(root, "include", inc)):
                    continue  # the public API
                if not os.path.exists(os.path.join(src, inc)):
                    continue  # not a source header (generated, or relative to a build dir)
                target = layer_of(inc, table)
                if target is None:
                    bad.append(f"src/{rel}: includes \"{inc}\", whose folder has no row in the table")
                    continue
                if target == me or target in table[me]:
                    continue
                lineno = text.count("\n", 0, m.start()) + 1
                allowed = ", ".join(sorted(table[me])) or "nothing outside it"
                bad.append(f"src/{rel}:{lineno}: includes \"{inc}\" (layer {target}), but "
                           f"src/{me}/ may include only: {allowed}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    bad = check(args.root)
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} include(s) against the layer table of docs/architecture.md")
        return 1
    print("layers: every include under src/ follows docs/architecture.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
