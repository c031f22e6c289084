"""The gym benchmark still runs: a tiny run prints its tables and saves what the report is built from (no
timing is asserted: benchmarks are for measuring, bench/README.md)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("gymnasium")

from test_bench_smoke import run

pytestmark = [pytest.mark.gym, pytest.mark.ros, pytest.mark.slow]


def test_the_gym_benchmark_prints_its_tables_and_its_report_section(tmp_path):
    results = tmp_path / "gym.json"
    out = run("bench_gym.py", "--quick", "--json", str(results), timeout=240)
    assert "| env steps | direct: return (mean ± std) | through ROS: return (mean ± std) |" in out
    assert "| copies | direct env steps/s | gym robot + bridge env steps/s | ROS ÷ direct |" in out
    # one copy and a deterministic trainer: the very same episodes on both paths
    assert "Same episodes, return for return, on both paths: 1 of 1 seeds" in out
    saved = json.loads(results.read_text())
    assert saved["benchmark"] == "gym" and saved["rows"]
    run("run_all.py", "--report-only", "--out", str(tmp_path))
    assert "### Gymnasium through ROS: learning equivalence" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "gym.png").stat().st_size > 10_000
