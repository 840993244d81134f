#!/usr/bin/env python3
"""Compares two runs of the GPU tests (googletest's --gtest_output=json files), one per transport:
the in-process transport must not hide a failure that NCCL shows, nor the other way round.

    scripts/gpu/compare_outcomes.py NCCL.json IN_PROCESS.json

Prints every test whose outcome differs, and the tests that ran on one transport only (a test that
needs processes skips in-process, one that needs ranks sharing a GPU skips on NCCL). Exits 1 where a
test failed on either, or passed on one and failed on the other; else 0."""

import json
import sys


def outcomes(path):
    """{suite.test: 'passed' | 'failed' | 'skipped'} of one googletest JSON report."""
    with open(path) as f:
        report = json.load(f)
    found = {}
    for suite in report.get("testsuites", []):
        for test in suite.get("testsuite", []):
            name = f"{suite['name']}.{test['name']}"
            if test.get("failures"):
                found[name] = "failed"
            elif test.get("result") == "SKIPPED" or test.get("status") == "NOTRUN":
                found[name] = "skipped"
            else:
                found[name] = "passed"
    return found


def compare(first, second, names=("first", "second")):
    """(lines to print, whether every test that ran passed on both)."""
    lines, ok = [], True
    for test in sorted(set(first) | set(second)):
        a, b = first.get(test, "absent"), second.get(test, "absent")
        if "failed" in (a, b):
            ok = False
        if a == b:
            if a == "failed":
                lines.append(f"failed on both: {test}")
            continue
        ran = [s for s in (a, b) if s in ("passed", "failed")]
        if len(ran) == 2:
            lines.append(f"differs: {test}: {names[0]} {a}, {names[1]} {b}")
        elif ran:
            where = names[0] if a in ("passed", "failed") else names[1]
            lines.append(f"ran on {where} only ({ran[0]}): {test}")
    counts = [sum(1 for s in o.values() if s == "passed") for o in (first, second)]
    lines.append(f"{names[0]}: {counts[0]} passed; {names[1]}: {counts[1]} passed; "
                 + ("no failure" if ok else "FAILURES above"))
    return lines, ok


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    lines, ok = compare(outcomes(argv[1]), outcomes(argv[2]), ("nccl", "in-process"))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
