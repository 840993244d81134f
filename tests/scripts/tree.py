"""The source tree as the script tests see it: its root, the files git tracks, and their text."""
import os
import subprocess

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def tracked(*paths):
    """The files git tracks below `paths` (relative to ROOT); every file there outside a git checkout."""
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


def report(name, problems):
    """Prints each problem and the count; the exit status for them (1 where there is any)."""
    for p in problems:
        print(p)
    print(f"{name}: {len(problems)} problem(s)")
    return 1 if problems else 0
