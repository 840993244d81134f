#!/usr/bin/env python3
"""Turns asynctp-bench's --json output (and, optionally, torch_anchor.py's lines from the same run)
into the Markdown table docs/performance.md uses: per (op, shape), the GEMM alone, every algorithm's
median (the fastest in bold), auto's choice, auto against sequential, and PyTorch's two paths.

usage: scripts/tables/bench_table.py BENCH_JSON [ANCHOR_LINES]

ANCHOR_LINES: the JSON lines torch_anchor.py prints (one per seed shape); shapes it has no line for
get "–". Only the figures are written here: what they show is for the reader of the run to say.
"""
import json
import sys

ALGOS = ("sequential", "pipelined", "fused")
OP_NAMES = {"ag": "all_gather_matmul", "rs": "matmul_reduce_scatter"}
ANCHOR_KEYS = {"ag": ("cublas_nccl_ag_mm", "torch_fused_ag_mm"), "rs": ("cublas_nccl_mm_rs", "torch_fused_mm_rs")}


def fmt(x):
    return "–" if x is None else f"{x:.1f}"


def main():
    rows = {}
    order = []
    for line in open(sys.argv[1]):
        r = json.loads(line)
        key = (r["op"], r["M"], r["N"], r["K"])
        if key not in rows:
            rows[key] = {"gemm": r["gemm_alone_us"], "auto": None, "choice": ""}
            order.append(key)
        if not r["correct"]:
            continue
        if r["algorithm"].startswith("auto"):
            rows[key]["auto"] = r["median_us"]
            rows[key]["choice"] = r.get("auto_choice", "?")
        else:
            rows[key][r["algorithm"]] = r["median_us"]
    anchor = {}
    if len(sys.argv) > 2:
        for line in open(sys.argv[2]):
            line = line.strip()
            if line.startswith("{"):
                a = json.loads(line)
                anchor[(a["M"], a["N"], a["K"])] = a
    print("| op | shape | GEMM alone | sequential | pipelined | fused | auto (its choice) | auto / sequential "
          "| torch NCCL+cuBLAS | torch fused |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for op in ("ag", "rs"):
        for key in (k for k in order if k[0] == op):
            r = rows[key]
            times = {a: r.get(a) for a in ALGOS}
            best = min((t for t in times.values() if t is not None), default=None)
            cells = [f"**{fmt(t)}**" if t is not None and t == best else fmt(t) for t in times.values()]
            a = anchor.get(key[1:])
            torch_cells = [fmt(a.get(k)) if a and isinstance(a.get(k), float) else "–" for k in ANCHOR_KEYS[op]]
            ratio = f"{r['auto'] / r['sequential']:.3f}" if r["auto"] and r.get("sequential") else "–"
            print(f"| {OP_NAMES[op]} | {key[1]}×{key[2]}×{key[3]} | {fmt(r['gemm'])} | " + " | ".join(cells) +
                  f" | {fmt(r['auto'])} ({r['choice']}) | {ratio} | " + " | ".join(torch_cells) + " |")


if __name__ == "__main__":
    main()
