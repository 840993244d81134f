#!/usr/bin/env python3
"""The Markdown tables the docs' figures come from (scripts/tables/bench_table.py, scripts/tables/ab_table.py), made
from asynctp-bench JSON lines written here: a wrong figure in them would go into the docs."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "tables")


def row(algorithm, median, correct=True, gemm=90.0, shape=(4096, 3584, 8192), **extra):
    m, n, k = shape
    return dict(op="rs", M=m, N=n, K=k, algorithm=algorithm, median_us=median, correct=correct,
                gemm_alone_us=gemm, **extra)


class Tables(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, rows):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        return path

    def run_script(self, script, *args):
        done = subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *args], capture_output=True,
                              text=True, check=True)
        return done.stdout.splitlines(), done.stderr

    def test_ab_table_lists_each_labels_runs_in_order(self):
        a1 = self.write("a1.json", [row("fused", 120.0, gemm=91.0), row("pipelined", 130.0, gemm=91.0)])
        a2 = self.write("a2.json", [row("fused", 121.5, gemm=93.0), row("pipelined", 131.0, gemm=93.0)])
        b1 = self.write("b1.json", [row("fused", 110.0, correct=False, gemm=92.0), row("pipelined", 129.0, gemm=92.0)])
        lines, err = self.run_script("ab_table.py", f"copy={a1}", f"kernel={b1}", f"copy={a2}",
                                     f"kernel={self.dir.name}/missing.json")
        self.assertEqual(lines[0], "| op | shape | algorithm | GEMM alone | copy | kernel |")
        self.assertIn("| rs | 4096×3584×8192 | fused | 91.0–93.0 | 120.0, 121.5 | wrong, – |", lines)
        self.assertIn("| rs | 4096×3584×8192 | pipelined | 91.0–93.0 | 130.0, 131.0 | 129.0, – |", lines)
        self.assertIn("missing.json not read", err)

    def test_ab_table_refuses_an_argument_without_a_label(self):
        done = subprocess.run([sys.executable, os.path.join(SCRIPTS, "ab_table.py"), "a.json"], capture_output=True,
                              text=True)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("not LABEL=BENCH_JSON", done.stderr)

    def test_bench_table_bolds_the_fastest_and_divides_auto_by_sequential(self):
        bench = self.write("bench.json", [
            row("sequential", 200.0), row("pipelined", 150.0), row("fused", 120.0),
            row("auto", 125.0, auto_choice="fused/2"), row("fused", 100.0, correct=False, shape=(2048, 3584, 8192)),
            row("sequential", 110.0, shape=(2048, 3584, 8192)),
        ])
        anchor = os.path.join(self.dir.name, "anchor.txt")
        with open(anchor, "w") as f:
            f.write("a line torch printed\n")
            f.write(json.dumps({"M": 4096, "N": 3584, "K": 8192, "cublas_nccl_mm_rs": 210.3,
                                "torch_fused_mm_rs": 190.0}) + "\n")
        lines, _ = self.run_script("bench_table.py", bench, anchor)
        self.assertIn("| matmul_reduce_scatter | 4096×3584×8192 | 90.0 | 200.0 | 150.0 | **120.0** | 125.0 (fused/2) "
                      "| 0.625 | 210.3 | 190.0 |", lines)
        # A result that failed its check is left out, not shown as the fastest.
        self.assertIn("| matmul_reduce_scatter | 2048×3584×8192 | 90.0 | **110.0** | – | – | – () | – | – | – |", lines)


if __name__ == "__main__":
    unittest.main()
