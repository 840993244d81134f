#!/usr/bin/env python3
"""scripts/gpu/compare_outcomes.py on googletest JSON reports written here: a failure it let through
would let the in-process transport hide a bug that NCCL shows."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpu", "compare_outcomes.py")


def report(**tests):
    """A googletest JSON report; each keyword is Suite_Test=outcome ('passed', 'failed', 'skipped')."""
    suites = {}
    for key, outcome in tests.items():
        suite, name = key.split("_", 1)
        entry = {"name": name, "status": "RUN", "result": "SKIPPED" if outcome == "skipped" else "COMPLETED"}
        if outcome == "failed":
            entry["failures"] = [{"failure": "x.cu:1\nExpected: true", "type": ""}]
        suites.setdefault(suite, []).append(entry)
    return {"testsuites": [{"name": s, "testsuite": t} for s, t in suites.items()]}


class CompareOutcomes(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, content):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            json.dump(content, f)
        return path

    def run_on(self, nccl, in_process):
        """Each side a report or a list of reports (one per suite)."""
        sides = []
        for side, reports in (("nccl", nccl), ("in_process", in_process)):
            reports = reports if isinstance(reports, list) else [reports]
            sides.append([self.write(f"{side}_{i}.json", r) for i, r in enumerate(reports)])
        done = subprocess.run([sys.executable, SCRIPT, "--nccl", *sides[0], "--in-process", *sides[1]],
                              capture_output=True, text=True)
        return done.returncode, done.stdout.splitlines()

    def test_the_same_passes_on_both_is_no_failure(self):
        rc, lines = self.run_on(report(Ops_A="passed", Ops_B="passed"), report(Ops_A="passed", Ops_B="passed"))
        self.assertEqual(rc, 0, lines)
        self.assertEqual(lines, ["nccl: 2 passed; in-process: 2 passed; no failure"])

    def test_a_failure_on_one_transport_only_is_named_and_fails(self):
        rc, lines = self.run_on(report(Ops_A="failed", Ops_B="passed"), report(Ops_A="passed", Ops_B="passed"))
        self.assertEqual(rc, 1)
        self.assertIn("differs: Ops.A: nccl failed, in-process passed", lines)

    def test_a_failure_on_both_fails(self):
        rc, lines = self.run_on(report(Ops_A="failed"), report(Ops_A="failed"))
        self.assertEqual(rc, 1)
        self.assertIn("failed on both: Ops.A", lines)

    def test_a_test_that_runs_on_one_transport_only_is_listed_not_failed(self):
        rc, lines = self.run_on(report(Faults_A="passed", Ops_B="passed"), report(Faults_A="skipped", Ops_B="passed"))
        self.assertEqual(rc, 0, lines)
        self.assertIn("ran on nccl only (passed): Faults.A", lines)

    def test_a_failure_where_the_other_transport_skips_still_fails(self):
        rc, lines = self.run_on(report(Share_A="skipped"), report(Share_A="failed"))
        self.assertEqual(rc, 1)
        self.assertIn("ran on in-process only (failed): Share.A", lines)

    def test_reports_of_one_side_are_read_together(self):
        rc, lines = self.run_on(report(Ops_A="passed", Faults_B="passed"),
                                [report(Ops_A="passed"), report(Faults_B="failed")])
        self.assertEqual(rc, 1)
        self.assertIn("differs: Faults.B: nccl passed, in-process failed", lines)

    def test_a_suite_with_no_report_on_one_side_is_listed_not_failed(self):
        rc, lines = self.run_on([report(Ops_A="passed")], [report(Ops_A="passed"), report(Late_B="passed")])
        self.assertEqual(rc, 0, lines)
        self.assertIn("ran on in-process only (passed): Late.B", lines)


if __name__ == "__main__":
    unittest.main()
