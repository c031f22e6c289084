"""bench/bench_intervention.py's smoke run: SAC alone, with a scripted person, and with demonstrations, briefly.

The benchmark itself (3 seeds, 4 minutes each, 5 minutes of demonstrations) is
a documented command (docs/intervention.md); this runs each of its parts once,
for seconds: the demonstrations recorded and exported, the three variants of
``plugrl-demo``, the table, its figures and the plot.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray.rllib")

from test_bench_smoke import run

pytestmark = [pytest.mark.rllib, pytest.mark.ros, pytest.mark.slow, pytest.mark.alone]


@pytest.mark.timeout(600)
def test_the_benchmark_runs_each_variant_and_reports_success_and_the_persons_share(tmp_path):
    results, plot = tmp_path / "results.json", tmp_path / "plot.png"
    out = run(
        "bench_intervention.py",
        *("--quick", "--output", str(tmp_path / "out"), "--json", str(results), "--plot", str(plot)),
        timeout=540,
    )
    assert "success rate by wall-clock minute" in out
    table = json.loads(results.read_text())
    assert set(table["variants"]) == {"sac", "sac+person", "sac+person+demos"}
    alone, person = table["variants"]["sac"], table["variants"]["sac+person"]
    assert alone["person_share"][0][0] == 0.0 and person["person_share"][0][0] > 0.0, table
    assert all(sum(r["episodes"]) > 0 for variant in table["variants"].values() for r in variant["runs"])
    assert plot.stat().st_size > 10_000
