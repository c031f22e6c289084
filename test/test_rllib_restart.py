"""A training run survives its driver's crash: SIGKILL, restart from the last checkpoint, the same bridge reconnects.

Real processes: the demo robot node, a bridge with the shipped config/demo.yaml,
and an RLlib driver (test/rllib_restart_driver.py: the demo's PPO through a PlugRL runner,
a checkpoint after every iteration) that is killed with SIGKILL mid-run and
started again with the same command.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from harness import Child, process, ros_env
from test_rllib_bridge import bridge, reserved_ports, robot

pytestmark = [pytest.mark.rllib, pytest.mark.ros, pytest.mark.websockets, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
ITERATIONS_BEFORE_KILL = 2
LINE_WAIT_S = 180.0  # a hang guard: a driver builds its algorithm and trains an iteration well within this


def lines(child: Child) -> list[dict]:
    return [json.loads(line) for line in child.output().splitlines() if line.startswith('{"event"')]


def wait_for_line(child: Child, predicate, what: str) -> dict:
    from harness import wait_until

    def found():
        assert child.proc.poll() is None, f"the driver exited ({child.proc.returncode}):\n{child.output()[-4000:]}"
        return next((line for line in lines(child) if predicate(line)), None)

    return wait_until(found, LINE_WAIT_S, what)


@pytest.mark.timeout(420)  # two drivers start Ray and build PPO: 1-2 minutes on a quiet 2-core machine
def test_a_killed_driver_resumes_from_its_last_checkpoint_and_the_bridge_reconnects_by_itself(tmp_path: Path):
    with reserved_ports(1) as port:
        _run(port, tmp_path / "checkpoints")


def _run(port: int, folder: Path) -> None:
    driver = [sys.executable, str(HERE / "rllib_restart_driver.py"), str(port), str(folder)]
    env = dict(ros_env(), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with process(robot(1)), process(bridge("bridge_restart", port, ["reacher0"])) as bridged:
        first = Child(driver, env, session=True)
        try:
            fresh = wait_for_line(first, lambda line: line["event"] == "built", "the first driver's algorithm")
            last = wait_for_line(
                first,
                lambda line: line["event"] == "iteration" and line["iteration"] >= ITERATIONS_BEFORE_KILL,
                f"{ITERATIONS_BEFORE_KILL} iterations, each checkpointed",
            )
            os.kill(first.proc.pid, signal.SIGKILL)  # the driver crashes (Ray's own processes are its group's)
            first.proc.wait(30)
        finally:
            first.stop()
        before = [line for line in lines(first) if line["event"] == "iteration"]
        last = before[-1]  # a later iteration may have finished before the kill landed
        assert Path(last["checkpoint"]).is_dir()
        assert bridged.proc.poll() is None, bridged.output()  # the bridge outlives the driver, holding the robot

        second = Child(driver, env, session=True)
        try:
            restored = wait_for_line(second, lambda line: line["event"] == "restored", "the restore")
            after = wait_for_line(second, lambda line: line["event"] == "iteration", "an iteration after the restore")
            print(json.dumps({"before": before, "restored": restored, "after": after}, indent=1))
            second.stop()  # SIGINT: the driver ends its run, the bridge is told plugrl-server-stop
        finally:
            second.stop()
        code = bridged.proc.wait(60)
    # the restore is the checkpoint: the learner's and the runner's weights, the MeanStdFilter's statistics
    assert restored["checkpoint"] == last["checkpoint"] and restored["iteration"] == last["iteration"]
    for part in ("learner", "runner", "filter"):
        assert restored[part] == last[part], part
    assert restored["learner"] != fresh["learner"]  # trained weights, not a fresh start
    # the run goes on from there: the next iteration, RLlib's step count continued, the same robot stepping again
    assert after["iteration"] == last["iteration"] + 1
    assert after["lifetime_steps"] > last["lifetime_steps"]
    assert after["episodes"] > 0, "the bridge did not reconnect to the restarted driver"
    assert code == 0, bridged.output()  # and it left when the restarted run ended, as a run's end says


def test_rllibs_three_checkpoint_apis_carry_the_runners_filter_statistics_and_weights(tmp_path: Path):
    """save_to_path, restore_from_path and Algorithm.from_checkpoint, on an algorithm whose runner is a PlugRL one."""
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.core import COMPONENT_ENV_TO_MODULE_CONNECTOR, COMPONENT_RL_MODULE
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    from rllib_restart_driver import CONFIG, digest

    from plugrl_ros.rllib.demo import demo_config

    built = []
    try:
        trained = demo_config(CONFIG, port=0, seed=1).build_algo()
        built.append(trained)
        runner = trained.env_runner
        rng = np.random.default_rng(0)
        for _ in range(20):  # the filter's statistics see observations, as from a robot (the runner's own pass)
            episode = SingleAgentEpisode(observation_space=runner.observation_space, action_space=runner.action_space)
            episode.add_env_reset(
                {"states": {k: rng.normal(2.0, 3.0, 4).astype(np.float32) for k in ("joints", "target")}}
            )
            runner._policy.prepare([episode], explore=True)
        saved = trained.save_to_path(tmp_path / "checkpoint")
        expected = runner.get_state()

        fresh = demo_config(CONFIG, port=0, seed=2).build_algo()
        built.append(fresh)
        assert digest(fresh.env_runner.get_state()[COMPONENT_ENV_TO_MODULE_CONNECTOR]) != digest(
            expected[COMPONENT_ENV_TO_MODULE_CONNECTOR]
        )
        fresh.restore_from_path(saved)
        loaded = Algorithm.from_checkpoint(saved)
        built.append(loaded)
        for algo in (fresh, loaded):
            state = algo.env_runner.get_state()
            for part in (COMPONENT_ENV_TO_MODULE_CONNECTOR, COMPONENT_RL_MODULE):
                assert digest(state[part]) == digest(expected[part]), part
    finally:
        for algo in built:
            algo.stop()


def test_the_latest_checkpoint_is_the_highest_complete_one(tmp_path: Path):
    from plugrl_ros.rllib.checkpoints import latest_checkpoint

    assert latest_checkpoint(tmp_path) is None
    for name in ("checkpoint_000002", "checkpoint_000010", "checkpoint_000011.partial", "checkpoint_000012"):
        (tmp_path / name).mkdir()
    for name in ("checkpoint_000002", "checkpoint_000010", "checkpoint_000011.partial"):
        (tmp_path / name / "rllib_checkpoint.json").write_text("{}")
    # 12 was never completed (no rllib_checkpoint.json), 11 was being written when its driver died
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint_000010"
