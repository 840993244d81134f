#!/usr/bin/env python3
"""Sets asynctp-bench runs of several builds or settings side by side: per (op, shape) and algorithm,
each label's medians in the order of its runs, and the GEMM alone over all runs (its range shows the
drift between them). A result that failed its check is shown as "wrong", a missing one as "–".

usage: scripts/tables/ab_table.py LABEL=BENCH_JSON [LABEL=BENCH_JSON ...]   (a label may come more than once)
"""
import json
import sys


def main():
    labels, runs = [], {}  # label -> [ {(op, M, N, K, algorithm): median or "wrong"} ]
    gemm, keys = {}, []
    for arg in sys.argv[1:]:
        label, _, path = arg.partition("=")
        if not path:
            sys.exit(f"ab_table.py: '{arg}' is not LABEL=BENCH_JSON")
        if label not in runs:
            labels.append(label)
            runs[label] = []
        run = {}
        try:
            lines = open(path).read().splitlines()
        except OSError as e:
            print(f"{label}: {path} not read ({e.strerror})", file=sys.stderr)
            lines = []
        for line in lines:
            r = json.loads(line)
            shape = (r["op"], r["M"], r["N"], r["K"])
            key = shape + (r["algorithm"],)
            if key not in keys:
                keys.append(key)
            run[key] = r["median_us"] if r["correct"] else "wrong"
            gemm.setdefault(shape, []).append(r["gemm_alone_us"])
        runs[label].append(run)

    def cell(label, key):
        values = [run.get(key, "–") for run in runs[label]]
        return ", ".join(v if isinstance(v, str) else f"{v:.1f}" for v in values)

    print("| op | shape | algorithm | GEMM alone | " + " | ".join(labels) + " |")
    print("|---|---|---|---|" + "---|" * len(labels))
    for key in keys:
        op, m, n, k, algorithm = key
        g = gemm[(op, m, n, k)]
        print(f"| {op} | {m}×{n}×{k} | {algorithm} | {min(g):.1f}–{max(g):.1f} | " +
              " | ".join(cell(label, key) for label in labels) + " |")


if __name__ == "__main__":
    main()
