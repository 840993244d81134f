#!/usr/bin/env python3
"""Keeps the docs true to the tree: every ASYNCTP_* environment variable that src/ reads is in
docs/reference/environment.md's table and every variable in that table is read somewhere; every
relative link in README.md and docs/ names a file (and heading) that exists; no tracked line tells of
the work periods that built the project."""
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def tracked(*paths):
    out = subprocess.run(["git", "-C", ROOT, "ls-files", *paths], capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout (a source tarball): walk the folders instead
        found = []
        for p in paths:
            for dirpath, _, names in os.walk(os.path.join(ROOT, p)):
                found += [os.path.relpath(os.path.join(dirpath, n), ROOT) for n in names]
        return found
    return out.stdout.split()


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


# A variable is read where its name appears as a string literal: getenv("X"), env_flag("X"), ...
READ = re.compile(r'"(ASYNCTP_[A-Z0-9_]+)"')
# The library's variables are the first column of the reference's first table.
ROW = re.compile(r"^\| `(ASYNCTP_[A-Z0-9_]+)` \|", re.M)


def env_problems():
    read_in_src = set()
    for rel in tracked("src"):
        read_in_src |= set(READ.findall(read(rel)))
    text = read("docs/reference/environment.md")
    library_table = text.split("Read elsewhere")[0]
    documented = set(ROW.findall(library_table))
    problems = [f"{v} is read in src/ but not in docs/reference/environment.md's table" for v in sorted(read_in_src - documented)]
    problems += [f"{v} is in docs/reference/environment.md's table but src/ does not read it" for v in sorted(documented - read_in_src)]
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
    problems = env_problems() + link_problems() + diary_problems()
    for p in problems:
        print(p)
    print(f"docs_test: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
