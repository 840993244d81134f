#!/usr/bin/env python3
"""Keeps the docs true to the tree: the ASYNCTP_* environment variables declared in src/common/env.h's
table (and named nowhere else in src/) are those of docs/reference/environment.md's table, with the
same use and values; every relative link in README.md and docs/ names a file (and heading) that
exists; the C API version is the same in its header, its reference and the Python package; no tracked
line tells of the work periods that built the project."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tree import ROOT, read, report, tracked  # noqa: E402

# The library's variables are declared in one table, src/common/env.h's ASYNCTP_KNOBS:
# X(id, "ASYNCTP_NAME", kind, "word|word", kUse or kMeasurement).
KNOB = re.compile(r'X\(k\w+, "(ASYNCTP_[A-Z0-9_]+)", k(\w+), "([^"]*)", k(Use|Measurement)\)')
# Anywhere else in src/, a variable's name as a whole string literal would be a read around the table.
LITERAL = re.compile(r'"(ASYNCTP_[A-Z0-9_]+)"')
# The reference's first table: | `ASYNCTP_NAME` | default | read | what it does | for |
ROW = re.compile(r"^\| `(ASYNCTP_[A-Z0-9_]+)` \|(.*)\| ([^|]*) \|$", re.M)
ENV_H = "src/common/env.h"


def env_problems():
    knobs = {name: (kind, words, use.lower()) for name, kind, words, use in KNOB.findall(read(ENV_H))}
    problems = [] if knobs else [f"{ENV_H}: no ASYNCTP_KNOBS entries found"]
    for rel in tracked("src"):
        if rel != ENV_H:
            problems += [f"{rel} names {v} outside {ENV_H}'s table: read it through the table"
                         for v in sorted(set(LITERAL.findall(read(rel))))]
    library_table = read("docs/reference/environment.md").split("Read elsewhere")[0]
    rows = {name: (middle, use.strip()) for name, middle, use in ROW.findall(library_table)}
    problems += [f"{v} is declared in {ENV_H} but not in docs/reference/environment.md's table"
                 for v in sorted(set(knobs) - set(rows))]
    problems += [f"{v} is in docs/reference/environment.md's table but not declared in {ENV_H}"
                 for v in sorted(set(rows) - set(knobs))]
    for name in sorted(set(knobs) & set(rows)):
        kind, words, use = knobs[name]
        middle, doc_use = rows[name]
        if not doc_use.startswith(use):
            problems.append(f"{name}: docs/reference/environment.md says '{doc_use}', {ENV_H} says k{use.title()}")
        for word in words.split("|") if words else []:
            if f"`{word}`" not in middle:
                problems.append(f"{name}: value `{word}` ({ENV_H}) is not in its row of docs/reference/environment.md")
    return problems


def slug(heading):
    h = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return h.replace(" ", "-")


LINK = re.compile(r"\]\(([^)\s]+)\)")


def link_problems():
    pages = [p for p in tracked("docs", "README.md") if p.endswith(".md")]
    headings = {}
    for p in pages:
        headings[p] = {slug(line.lstrip("#")) for line in read(p).splitlines() if line.startswith("#")}
    problems = []
    for p in pages:
        for target in LINK.findall(read(p)):
            if "://" in target or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            rel = os.path.normpath(os.path.join(os.path.dirname(p), path)) if path else p
            if not os.path.exists(os.path.join(ROOT, rel)):
                problems.append(f"{p}: link to {target}: no such file")
            elif anchor and rel in headings and anchor not in headings[rel]:
                problems.append(f"{p}: link to {target}: no such heading")
    return problems


def version_problems():
    """The C API version the header defines is the one docs/reference/c_api.md and the Python package name."""
    found = re.search(r"#define ASYNCTP_C_API_VERSION (\d+)", read("include/asynctp/c_api.h"))
    if not found:
        return ["include/asynctp/c_api.h: no ASYNCTP_C_API_VERSION"]
    version = found.group(1)
    problems = []
    documented = re.search(r"`int asynctp_c_api_version\(void\)` \|[^|]*\((\d+)\)", read("docs/reference/c_api.md"))
    if not documented or documented.group(1) != version:
        problems.append(f"docs/reference/c_api.md: asynctp_c_api_version's row does not say ({version})")
    python = re.search(r"^C_API_VERSION = (\d+)", read("python/asynctp/_lib.py"), re.M)
    if not python or python.group(1) != version:
        problems.append(f"python/asynctp/_lib.py: C_API_VERSION is not {version}")
    return problems


DIARY = re.compile(r"\bsessions?\b", re.I)


def diary_problems():
    problems = []
    for rel in tracked("."):
        if rel.startswith("tests/scripts/docs_test.py"):
            continue
        try:
            lines = read(rel).splitlines()
        except (IsADirectoryError, FileNotFoundError):
            continue
        for n, line in enumerate(lines, 1):
            # NCCL's own identifiers (ncclLsaBarrierSession) are not the project's words.
            if DIARY.search(line.replace("BarrierSession", "")):
                problems.append(f"{rel}:{n}: tells of the work that built the project, not of the project: {line.strip()[:100]}")
    return problems


def main():
    return report("docs_test", env_problems() + link_problems() + version_problems() + diary_problems())


if __name__ == "__main__":
    sys.exit(main())
