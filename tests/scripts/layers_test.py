#!/usr/bin/env python3
"""Keeps the layers of src/ pointing down. docs/design/architecture.md's table "The layers" says which
folders each folder of src/ may include (its "may include" column, followed downwards); every
`#include "folder/..."` in src/ must be allowed by it, or be one of the page's known exceptions, listed
there as `file -> header`. A known exception that is gone must leave the list too, so that the list
only shrinks. Source files over 400 lines must be on the page's list of long files."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tree import read, report, tracked  # noqa: E402

PAGE = "docs/design/architecture.md"
MAX_LINES = 400


def section(text, heading):
    """The lines under `## heading`, up to the next heading of that level."""
    m = re.search(r"^## " + re.escape(heading) + r"\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        raise SystemExit(f"layers_test: {PAGE} has no section '## {heading}'")
    return m.group(1)


# A row of the layers table: | `src/comm/` | what it holds | `common`, `kernels` |
ROW = re.compile(r"^\| `(src/[a-z]+|include/asynctp)/` \|[^|]*\| ([^|]*) \|$", re.M)
NAME = re.compile(r"`([a-z]+)`")


def layer_rules(text):
    """folder -> the folders it may include directly (`asynctp` for the public headers)."""
    direct = {}
    for path, may in ROW.findall(section(text, "The layers")):
        name = "asynctp" if path == "include/asynctp" else path.split("/")[1]
        direct[name] = set(NAME.findall(may))
    allowed = {}
    for name in direct:  # what a folder may include, it may include through: follow the table down
        seen, todo = set(), list(direct[name])
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            todo += [m for m in direct.get(n, ()) if m != "asynctp"]
        allowed[name] = seen
    return allowed


EXCEPTION = re.compile(r"^- `(src/[^`]+)` -> `([^`]+)`", re.M)
LONG = re.compile(r"^- `((?:src|tools|include|python)/[^`]+)`", re.M)


def problems():
    text = read(PAGE)
    allowed = layer_rules(text)
    known = set(EXCEPTION.findall(section(text, "Known upward includes")))
    found = set()
    out = []
    for rel in tracked("src"):
        layer = rel.split("/")[1]
        if layer not in allowed:
            out.append(f"{rel}: folder src/{layer}/ is not in {PAGE}'s table of layers")
            continue
        for inc in re.findall(r'^\s*#\s*include "([^"]+)"', read(rel), re.M):
            top = inc.split("/")[0]
            if "/" not in inc or top == layer or top in allowed[layer]:
                continue
            if (rel, inc) in known:
                found.add((rel, inc))
            else:
                out.append(f"{rel} includes {inc}: src/{layer}/ may include only "
                           f"{', '.join(sorted(allowed[layer])) or 'nothing'} ({PAGE})")
    # The torch extension stands on the C interface alone, as the Python package does.
    for rel in tracked("python/csrc"):
        for inc in re.findall(r'^\s*#\s*include "([^"]+)"', read(rel), re.M):
            if "/" in inc and inc != "asynctp/c_api.h":
                out.append(f"{rel} includes {inc}: python/csrc/ may include only its own files and asynctp/c_api.h "
                           f"({PAGE})")
    for rel, inc in sorted(known - found):
        out.append(f"{PAGE} lists {rel} -> {inc} as a known upward include, but it is gone: take it off the list")
    long_ok = set(LONG.findall(section(text, "Long files")))
    for rel in tracked("src", "include", "tools", "python/asynctp", "python/csrc"):
        if not re.search(r"\.(cc|cu|cuh|h|py)$", rel):
            continue
        lines = read(rel).count("\n")
        if lines > MAX_LINES and rel not in long_ok:
            out.append(f"{rel} has {lines} lines (over {MAX_LINES}) and is not on {PAGE}'s list of long files")
        if lines <= MAX_LINES and rel in long_ok:
            out.append(f"{PAGE} lists {rel} as a long file, but it has {lines} lines: take it off the list")
    return out


def main():
    return report("layers_test", problems())


if __name__ == "__main__":
    sys.exit(main())
