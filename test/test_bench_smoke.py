"""The benchmarks still run: a tiny run of each prints its table. Benchmarks are not tests, so
nothing here asserts a time or a ratio; bench/run_all.py and scripts/bench.sh are for measuring."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from harness import ROOT, ros_env

pytestmark = [pytest.mark.ros, pytest.mark.slow]

BENCH = ROOT / "bench"


def run(script: str, *args: str, timeout: float = 90.0) -> str:
    completed = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        check=False,
        env=ros_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed.stdout


def test_the_codec_benchmark_prints_its_table():
    out = run("bench_codec.py", "--quick")
    assert "| n | payload MB |" in out


def test_the_field_path_benchmark_prints_its_table_of_generic_against_typed():
    out = run("bench_field_paths.py", "--quick")
    assert "| converter | type | typed µs | generic µs | generic ÷ typed |" in out


@pytest.mark.parametrize(
    ("name", "header"),
    [
        ("observation", "| case | n | payload MB | floor µs |"),
        ("action", "| n | first actuator msg µs |"),
        ("timing", "| rate Hz | cameras | reuse | recording | publications |"),
        ("step_rate", "| code | H | rate Hz | env steps/s per robot | steps/s ÷ rate_hz |"),
        ("throughput", "| client | n | reuse | env steps/s |"),
        ("policy_execution", "| H | latency ms | mode | idle % |"),
        ("policy_node", "| case | env steps/s per robot | ÷ rate_hz | vs train | idle % |"),
        ("record", "| writer | case | µs per call | x no-op call | x memcpy of frames |"),
        ("network", "| mode | H | reuse | 0 ms: steps/s (idle) |"),
    ],
)
def test_each_benchmark_prints_its_table_and_saves_its_results(tmp_path, name, header):
    results = tmp_path / f"{name}.json"
    out = run(f"bench_{name}.py", "--quick", "--json", str(results))
    assert header in out
    saved = json.loads(results.read_text())
    assert saved["benchmark"] == name
    assert saved["rows"]


def test_the_report_is_built_from_saved_results(tmp_path):
    run("bench_action.py", "--quick", "--json", str(tmp_path / "action.json"))
    out = run("run_all.py", "--report-only", "--out", str(tmp_path))
    report = (tmp_path / "report.md").read_text()
    assert "### Action path" in report
    assert "report:" in out


def test_the_bench_script_runs_the_benchmarks_and_writes_the_report(tmp_path):
    """`scripts/bench.sh [--quick]`, as the README shows it (one benchmark, to stay quick)."""
    completed = subprocess.run(
        [str(ROOT / "scripts" / "bench.sh"), "--quick", "--only", "action", "--out", str(tmp_path)],
        check=False,
        env=ros_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "### Action path" in (tmp_path / "report.md").read_text()
