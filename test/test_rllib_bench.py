"""The RLlib benchmark still runs: a tiny SAC run through RLlib's own runner and through the gym robot, the
bridge and the PlugRL runner prints its table and saves both paths' results (no timing or return is asserted:
benchmarks are for measuring, bench/README.md)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("ray.rllib")

from test_bench_smoke import run

pytestmark = [pytest.mark.rllib, pytest.mark.gym, pytest.mark.ros, pytest.mark.slow]


def test_sac_runs_through_rllibs_own_runner_and_through_ros_and_the_table_compares_them(tmp_path):
    results = tmp_path / "rllib.json"
    plot = tmp_path / "sac.png"
    out = run("bench_rllib.py", "--quick", "--part", "sac", "--json", str(results), "--plot", str(plot), timeout=420)
    assert "| env steps | RLlib's own runner: return (mean ± std) | through ROS: return (mean ± std) |" in out
    saved = json.loads(results.read_text())
    assert saved["benchmark"] == "rllib"
    sac = saved["sac"]
    assert sac["steps"] == 300 and sac["seeds"] == [0]
    for path in ("own", "ros"):
        # each path ran its 300 env steps (one 200-step Pendulum episode ended in them) and reported a return
        ((ret,),) = sac["returns"][path]
        assert -2000.0 < ret < 0.0, (path, ret)
        ((figures,),) = [sac["per_step"][path]]
        assert figures["steps"] > 0 and figures["wall"] > 0
    assert plot.stat().st_size > 10_000


def test_a_timer_table_says_the_runners_thread_switch_interval_and_an_older_result_renders_without_it():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_rllib

    run_ = {"seed": 0, "minutes": 1.0, "steps": 3000, "episodes": [(0.5, -900.0)], "idle_share": 0.1,
            "idle_share_learning": 0.1}  # fmt: skip
    section = {"env": "Pendulum-v1", "rate_hz": 50.0, "runs": [run_], "learners": 1}
    assert bench_rllib.switch_interval_ms() == pytest.approx(0.5)  # the runner's default, which the driver keeps
    table = bench_rllib.sac_timer_table({**section, "switch_interval_ms": 0.5})
    assert "1 learner process(es) of its own, thread switch interval 0.5 ms)" in table
    assert "| 0 | 1.0 | 3,000 | -900.0 | -900.0 | 10.0% | 10.0% |" in table
    assert bench_rllib.sac_timer_table(section).splitlines()[0].endswith("1 learner process(es) of its own)")
    # the chunk's length is in the title; an older result (no horizon recorded) ran at H = 1
    assert "H = 4, 1 learner process(es)" in bench_rllib.sac_timer_table({**section, "horizon": 4})
    assert "H = 1, 1 learner process(es)" in bench_rllib.sac_timer_table(section)


def test_the_idle_share_counts_a_chunk_as_h_control_ticks():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_rllib

    # 40 s at 50 Hz: 2,000 ticks; 350 RL steps of H = 4 stepped 1,400 of them (30 % idle), of H = 1 350 (82.5 %)
    its = [{"t": 0.0, "steps": 0}, {"t": 30.0, "steps": 300}, {"t": 40.0, "steps": 350}]
    assert bench_rllib.idle_shares(its, 4)[0] == pytest.approx(0.3)
    assert bench_rllib.idle_shares(its, 1)[0] == pytest.approx(0.825)
    # while learning (from the first iteration past the 256 RL steps of warm-up): 10 s, 50 RL steps of 4 ticks
    assert bench_rllib.idle_shares(its, 4)[1] == pytest.approx(0.6)


def _bench_rllib():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_rllib

    return bench_rllib


def test_steps_to_reach_counts_env_steps_until_the_mean_of_the_last_five_episodes_first_reaches_the_mark():
    bench_rllib = _bench_rllib()
    # 200-step episodes
    returns = [-1200.0, -1100.0, -900.0, -150.0, -150.0, -150.0, -150.0, -100.0]
    episodes = [(float(i), ret, 200) for i, ret in enumerate(returns)]
    # after episode 5 (1,000 steps) the last five average -700, after 7 -300, after 8 (1,600 steps) -140
    assert bench_rllib.steps_to_reach(episodes, -250.0, 5) == 1_600
    assert bench_rllib.steps_to_reach(episodes[:7], -250.0, 5) is None
    assert bench_rllib.steps_to_reach(episodes[:3], -2000.0, 5) is None  # fewer than five episodes: no mean yet


def test_the_sac_table_has_a_mark_at_the_runs_end_and_each_seeds_steps_to_the_pass_mark(tmp_path):
    bench_rllib = _bench_rllib()
    episodes = [(float(i), -1000.0 if i < 40 else -150.0, 200) for i in range(60)]  # 12,000 env steps
    iterations = [{"t": 0.0, "cpu": 0.0, "steps": 0, "sample_wall": 0.0, "sample_cpu": 0.0},
                  {"t": 60.0, "cpu": 50.0, "steps": 12_000, "sample_wall": 10.0, "sample_cpu": 8.0}]  # fmt: skip
    for path in bench_rllib.PATHS:  # the files a run leaves, read back by --from-runs
        saved = {"iterations": iterations, "episodes": episodes, "robot_idle_share": []}
        (tmp_path / f"run_sac_{path}_1_0_lockstep_h1.json").write_text(json.dumps(saved))
    section = bench_rllib.saved_sac_runs(tmp_path, 12_000)
    assert section["marks"] == [5_000, 10_000, 12_000]
    assert section["reached"] == {"own": [9_000], "ros": [9_000]}  # the 45th episode ends the first five at -150
    table = bench_rllib.sac_table(section)
    assert "| 12,000 | -150.0 ± 0.0 | -150.0 ± 0.0 | +0.0 | yes |" in table
    assert "| 0 | 9,000 | 9,000 |" in table
