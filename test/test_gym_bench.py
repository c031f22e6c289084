"""The gym benchmark still runs: a tiny run prints its tables and saves what the report is built from (no
timing is asserted: benchmarks are for measuring, bench/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("gymnasium")

from harness import ROOT, ros_env

pytestmark = [pytest.mark.gym, pytest.mark.ros, pytest.mark.slow]


def test_the_gym_benchmark_prints_its_tables_and_its_report_section(tmp_path):
    results = tmp_path / "gym.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_gym.py"), "--quick", "--json", str(results)],
        check=False,
        env=ros_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "| env steps | direct: return (mean ± std) | through ROS: return (mean ± std) |" in completed.stdout
    assert "| copies | direct env steps/s | gym robot + bridge env steps/s | ROS ÷ direct |" in completed.stdout
    assert "Same episodes, return for return, on both paths: 1 of 1 seeds" in completed.stdout
    saved = json.loads(results.read_text())
    assert saved["benchmark"] == "gym" and saved["rows"]
    report = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run_all.py"), "--report-only", "--out", str(tmp_path)],
        check=False,
        env=ros_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert "### Gymnasium through ROS: learning equivalence" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "gym.png").stat().st_size > 10_000
