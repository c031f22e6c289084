"""The gym benchmark still runs: a tiny run prints its tables and saves what the report is built from (no
timing is asserted: benchmarks are for measuring, bench/README.md), with the demo trainer and with RLlib PPO."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("gymnasium")

from test_bench_smoke import run

pytestmark = [pytest.mark.gym, pytest.mark.ros, pytest.mark.slow]


def test_the_gym_benchmark_prints_its_tables_and_its_report_section(tmp_path):
    results = tmp_path / "gym.json"
    out = run("bench_gym.py", "--quick", "--trainer", "demo", "--json", str(results), timeout=240)
    assert "| env steps | direct: return (mean ± std) | through ROS: return (mean ± std) |" in out
    assert "| copies | direct env steps/s | ROS floor env steps/s | gym robot + bridge env steps/s |" in out
    # one copy and a deterministic trainer: the very same episodes on both paths
    assert "Same episodes, return for return, on both paths: 1 of 1 seeds" in out
    saved = json.loads(results.read_text())
    assert saved["benchmark"] == "gym"
    # the three paths of the throughput part, each of which stepped
    assert sorted(r["path"] for r in saved["rows"]) == ["direct", "ros", "ros-floor"]
    assert all(r["steps_per_s"] > 0 for r in saved["rows"])
    run("run_all.py", "--report-only", "--out", str(tmp_path))
    assert "### Gymnasium through ROS: learning equivalence" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "gym.png").stat().st_size > 10_000


@pytest.mark.rllib
def test_rllib_ppo_learns_from_the_very_same_episodes_on_both_paths(tmp_path):
    """RLlib PPO, its PlugRL runner serving the direct client and then the bridge, over one update: with the
    whole batch awaited by every sample, the ROS path changes nothing the learner sees; the same PPO through
    RLlib's own runner is the per-step baseline."""
    pytest.importorskip("ray.rllib")
    pytest.importorskip("mujoco")
    results = tmp_path / "gym.json"
    out = run("bench_gym.py", "--quick", "--part", "learning", "--json", str(results), timeout=600)
    assert "trainer `rllib`, 1 seeds, 1 copy, 1,200 env steps per run" in out
    assert "Same episodes, return for return, on both paths: 1 of 1 seeds" in out
    # the baseline is RLlib's own runner on the same config, seed, module and connectors, which ran too
    header = "| RLlib's own runner (baseline) | direct (in-process client) | through ROS | ROS ÷ RLlib's own runner |"
    assert header in out
    saved = json.loads(results.read_text())
    (learning,) = saved["learning"]
    ((own_curve,),) = [learning["returns"]["own"]]
    assert len(own_curve) == len(learning["marks"]) and learning["wall_per_step"]["own"] > 0
    assert learning["trainer"] == "rllib" and not saved["rows"]
    # each run took 1,200 steps, more than one PPO batch (1,000): what the update learned was compared too
    assert learning["steps"] == 1_200
    ((first, compared),) = learning["first_difference"]
    assert first is None and compared > 0
