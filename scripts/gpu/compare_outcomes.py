#!/usr/bin/env python3
"""Compares two runs of the GPU tests (googletest's --gtest_output=json files), one per transport:
the in-process transport must not hide a failure that NCCL shows, nor the other way round.

    scripts/gpu/compare_outcomes.py --nccl NCCL.json... --in-process IN_PROCESS.json...

Each side is one or more reports (a run per suite, say). Prints every test whose outcome differs, and
the tests that ran on one transport only (a test that needs processes skips in-process, one that needs
ranks sharing a GPU skips on NCCL, a suite cut off by a time limit has no report). Exits 1 where a test
failed on either, or passed on one and failed on the other; else 0."""

import argparse
import json
import sys


def outcomes(paths):
    """{suite.test: 'passed' | 'failed' | 'skipped'} of googletest JSON reports."""
    found = {}
    for path in paths:
        with open(path) as f:
            found.update(outcomes_of(json.load(f)))
    return found


def outcomes_of(report):
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nccl", nargs="+", required=True, metavar="JSON", help="the reports of the NCCL run")
    parser.add_argument("--in-process", nargs="+", required=True, metavar="JSON",
                        help="the reports of the in-process run")
    args = parser.parse_args(argv[1:])
    lines, ok = compare(outcomes(args.nccl), outcomes(args.in_process), ("nccl", "in-process"))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
