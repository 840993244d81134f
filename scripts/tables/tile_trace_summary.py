#!/usr/bin/env python3
"""Summarizes tile traces written under ASYNCTP_TRACE_TILES=DIR (src/kernels/fused/tile_trace.h).

usage: scripts/tables/tile_trace_summary.py DIR_OR_CSV...

For each file: the kernel's span and how long its prologue took (from a CTA's start until its
mainloop producer had its first tile), then per kind of tile (staged: a reduce-scatter tile of a peer's
rows; own: one that adds the peers' chunks; split: a K-split of the last round; plain) the mean time
of its mainloop, of the wait inside fixup, of fixup as a whole and of its epilogue, in µs; then, for
each round (the k-th unit of every CTA), when its first and last tiles ended; then the call's
marks (<op>_<shape>_rank<r>.calls): when the stream and the host reached each. A ping-pong kernel's
records (fp8 with row-wise scales on a few rounds of tiles) have no fixup marks, and its two tiles
in flight per CTA share the time: only each round's ends are given for it.
"""
import csv
import glob
import os
import sys
from collections import defaultdict


def kind(r):
    if int(r["splits"]) > 1:
        return "split"
    if int(r["staged"]):
        return "staged"
    return "own" if int(r["wait_done_ns"]) >= 0 else "plain"


def summarize(path):
    rows = list(csv.DictReader(open(path)))
    if not rows:
        print(f"{path}: empty")
        return
    per_cta = defaultdict(list)
    for r in rows:
        per_cta[(int(r["cluster"]), int(r["cta"]))].append(r)
    stats = defaultdict(lambda: defaultdict(float))
    counts = defaultdict(int)
    rounds = defaultdict(list)
    end = 0
    pingpong = all(int(r["fixup_enter_ns"]) < 0 for r in rows)
    for seq in per_cta.values():
        seq.sort(key=lambda r: int(r["epilogue_done_ns" if pingpong else "fixup_enter_ns"]))
        prev = int(seq[0]["start_ns"])
        for k, r in enumerate(seq):
            if pingpong:
                rounds[k].append(int(r["epilogue_done_ns"]))
                end = max(end, int(r["epilogue_done_ns"]))
                continue
            enter, exit_, done = int(r["fixup_enter_ns"]), int(r["fixup_exit_ns"]), int(r["epilogue_done_ns"])
            wait = int(r["wait_done_ns"])
            s = stats[kind(r)]
            counts[kind(r)] += 1
            s["mainloop"] += enter - prev
            s["wait"] += (wait - enter) if wait >= 0 else 0
            s["fixup"] += exit_ - enter
            s["epilogue"] += done - exit_
            rounds[k].append(done)
            prev = done
            end = max(end, done)
    starts = [int(r["start_ns"]) for r in rows]
    print(f"{os.path.basename(path)}: {len(rows)} tile records, CTAs started within {max(starts) / 1e3:.1f} µs, "
          f"last epilogue at {end / 1e3:.1f} µs")
    prologue = sorted(int(r["producer_start_ns"]) - int(r["start_ns"]) for r in rows
                      if int(r.get("producer_start_ns", -1)) >= 0)
    if prologue:
        print(f"  the mainloop producer past the kernel's prologue: {prologue[0] / 1e3:.1f} / "
              f"{prologue[len(prologue) // 2] / 1e3:.1f} / {prologue[-1] / 1e3:.1f} µs after the CTA's start (min / median / max)")
    if pingpong:
        print("  ping-pong kernel: no fixup marks, two tiles in flight a CTA")
    else:
        print("  kind    tiles  mainloop   wait  fixup  epilogue (mean µs)")
    for k in ("staged", "own", "plain", "split"):
        if counts[k]:
            n = counts[k]
            s = stats[k]
            print(f"  {k:7s} {n:5d} {s['mainloop'] / n / 1e3:9.1f} {s['wait'] / n / 1e3:6.1f} "
                  f"{s['fixup'] / n / 1e3:6.1f} {s['epilogue'] / n / 1e3:9.1f}")
    print("  round  tiles  first end  last end (µs)")
    for k in sorted(rounds):
        v = rounds[k]
        print(f"  {k:5d} {len(v):6d} {min(v) / 1e3:10.1f} {max(v) / 1e3:9.1f}")
    calls = path[: -len(".csv")] + ".calls"
    if os.path.exists(calls):
        print("  the call (µs from its entry): mark, GPU reached it, host passed it")
        for line in open(calls).read().split("\n")[1:]:
            if line.strip():
                name, gpu, host = line.split()
                gpu = f"{float(gpu):9.1f}" if gpu != "-" else f"{'-':>9s}"
                print(f"    {name:12s} {gpu} {float(host):9.1f}")


def main():
    paths = []
    for a in sys.argv[1:] or ["."]:
        paths += sorted(glob.glob(os.path.join(a, "*.csv"))) if os.path.isdir(a) else [a]
    for p in paths:
        summarize(p)


if __name__ == "__main__":
    main()
