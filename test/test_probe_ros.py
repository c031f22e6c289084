"""The whole deployment: probe robot and bridge as real ROS processes over DDS, checked by the test trainer.

``plugrl-probe`` (without --headless) starts the probe robot and a bridge
configured by the shipped config/probe.yaml; the test trainer runs its
scenarios against it and reports, clause by clause, what the bridge broke.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from harness import ROOT, TrainerThread, process, python_module, ros_env

from plugrl_ros.shipped import shipped_file
from plugrl_ros.tools.test_trainer import (
    INFO_EPISODE,
    NO_EMPTY_CONNECTIONS,
    RECONNECTS,
    RESET_OBSERVATION,
    REWARD_SUM,
    TERMINAL_OBSERVATION,
    TIME_MAJOR,
    TrainerSettings,
)

# The link's endings are the headless probe's (test_headless_probe) and, over ROS, test_faults' probe deployment.
pytestmark = [pytest.mark.ros, pytest.mark.websockets_incidental, pytest.mark.slow]


def trainer_settings(**overrides: object) -> TrainerSettings:
    values: dict = {
        "port": 0,
        "script": ("resync", "timeout", "stop"),
        "feedbacks_per_connection": 12,
        "metadata_delay_s": 0.2,
        "grace_s": 1.0,
        "reconnect_window_s": 15.0,
    }
    values.update(overrides)
    return TrainerSettings(**values)


def run_probe(settings: TrainerSettings, *args: str, timeout: float = 120.0):
    trainer = TrainerThread(settings)
    trainer.start()
    with process(python_module("plugrl_ros.tools.probe", "--server", trainer.uri, *args)) as probe:
        code = probe.wait(timeout)
        report = trainer.report(timeout=30)
        return code, report, probe.output()


@pytest.mark.parametrize("mode", ["lockstep", "timer"])
@pytest.mark.parametrize("envs", [1, 3, 7])
@pytest.mark.parametrize("reuse", [True, False], ids=["reuse", "no-reuse"])
def test_the_ros_probe_passes_every_clause(mode, envs, reuse):
    features = ("reuse-feedback-obs",) if reuse else ()
    settings = trainer_settings(features=features, n_envs=envs)
    code, report, output = run_probe(settings, "--envs", str(envs), "--mode", mode, "--rate", "50")
    assert code == 0, output
    assert report.failed == 0, report.text() + output
    assert not report.incomplete, report.text() + output
    for clause in (REWARD_SUM, TERMINAL_OBSERVATION, TIME_MAJOR):
        assert report.clause(clause).passed >= 12, report.text()


def test_the_ros_probe_stops_with_a_failure_status_after_a_text_frame():
    code, report, output = run_probe(trainer_settings(script=("resync", "text")), "--envs", "2", "--mode", "timer")
    assert code == 1, output
    assert report.failed == 0, report.text() + output
    assert "text frame" in output


def test_the_ros_probe_with_a_horizon_of_one_and_float64_actions():
    settings = trainer_settings(script=("stop",), horizon=1, action_dtype="<f8", action_dim=3)
    code, report, output = run_probe(settings, "--envs", "3", "--mode", "lockstep", "--action-dim", "3")
    assert code == 0, output
    assert report.failed == 0, report.text() + output


@pytest.mark.parametrize("mode", ["lockstep", "timer"])
def test_the_ros_probe_learns_the_trainers_width_and_horizon_on_its_one_connection(mode):
    # no --action-dim: the bridge connects (once) and the probe reads the trainer's metadata from its
    # /diagnostics before it starts the robot; the trainer sees exactly one connection per entry of its
    # script (resync: the bridge's reconnect; stop: the end), never one that connected and left
    settings = trainer_settings(script=("resync", "stop"), horizon=6, action_dim=3)
    code, report, output = run_probe(settings, "--envs", "2", "--mode", mode, "--rate", "50")
    assert code == 0, output
    assert report.failed == 0, report.text() + output
    assert not report.incomplete, report.text() + output
    assert report.clause(TIME_MAJOR).passed >= 12, report.text()
    assert report.connections == 2, report.text() + output
    assert report.clause(NO_EMPTY_CONNECTIONS).passed == 2 and report.clause(RECONNECTS).failed == 0


def bridge_for_probe(uri: str, envs: int, mode: str) -> list[str]:
    """The bridge as plugrl-probe starts it: the shipped config/probe.yaml with this run's trainer and envs."""
    names = ", ".join(f"'probe{i}'" for i in range(envs))
    return python_module(
        "plugrl_ros.node.bridge_main",
        "--ros-args",
        "--params-file",
        str(shipped_file("config", "probe.yaml")),
        "-p",
        f"trainer.uri:={uri}",
        "-p",
        f"envs:=[{names}]",
        "-p",
        f"control.mode:={mode}",
    )


@pytest.mark.parametrize("mode", ["lockstep", "timer"])
def test_a_bridge_restarted_while_the_probe_robot_keeps_running_starts_fresh_episodes_every_time(mode):
    # Each run stops after a few feedbacks, so the robot is left in the middle of
    # its episodes; the next bridge (and a trainer that knows nothing of them)
    # must still see whole episodes from t 0.
    envs = 3
    with process(python_module("plugrl_ros.tools.probe_robot", "--envs", str(envs))) as robot:
        for run in range(4):
            trainer = TrainerThread(trainer_settings(script=("stop",), n_envs=envs, feedbacks_per_connection=7))
            trainer.start()
            with process(bridge_for_probe(trainer.uri, envs, mode)) as bridge:
                code = bridge.wait(60)
                report = trainer.report(timeout=30)
                where = f"run {run}:\n{report.text()}\n{bridge.output()}"
                assert code == 0, where
                assert report.failed == 0, where
                for clause in (INFO_EPISODE, TERMINAL_OBSERVATION, RESET_OBSERVATION):
                    assert report.clause(clause).passed >= 1, where
        assert robot.proc.poll() is None, robot.output()


LAUNCH_ENV = os.environ.get("PLUGRL_ROS2_LAUNCH_ENV", "")


@pytest.mark.skipif(
    not (LAUNCH_ENV and Path(LAUNCH_ENV).is_file()),
    reason="opt-in: set PLUGRL_ROS2_LAUNCH_ENV to the env.sh of a ros2 launch toolchain",
)
def test_under_ros2_launch_a_bridge_restarted_while_the_probe_robot_keeps_running_passes_every_time(tmp_path):
    """The operator's path: the robot under `ros2 run`, the bridge under `ros2 launch`, restarted 3 times."""
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "plugrl_ros").symlink_to(ROOT)

    def shell(command: str) -> list[str]:
        return ["bash", "-c", f"source {shlex.quote(LAUNCH_ENV)} && {command}"]

    build = subprocess.run(
        shell(f"cd {shlex.quote(str(workspace))} && colcon build --symlink-install"),
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env=ros_env(),
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    setup = f"source {shlex.quote(str(workspace / 'install' / 'setup.bash'))}"
    config = workspace / "install" / "plugrl_ros" / "share" / "plugrl_ros" / "config" / "probe.yaml"
    with process(shell(f"{setup} && exec ros2 run plugrl_ros probe_robot --envs 1")) as robot:
        for run in range(3):
            trainer = TrainerThread(trainer_settings(script=("stop",), n_envs=1, feedbacks_per_connection=7))
            trainer.start()
            launch = f"exec ros2 launch plugrl_ros bridge.launch.py config:={config} server_uri:={trainer.uri}"
            with process(shell(f"{setup} && {launch}")) as bridge:
                code = bridge.wait(90)
                report = trainer.report(timeout=30)
                where = f"run {run}:\n{report.text()}\n{bridge.output()}"
                assert code == 0 and "process has finished cleanly" in bridge.output(), where
                assert report.failed == 0, where
                for clause in (INFO_EPISODE, TERMINAL_OBSERVATION, RESET_OBSERVATION):
                    assert report.clause(clause).passed >= 1, where
        assert robot.proc.poll() is None, robot.output()
