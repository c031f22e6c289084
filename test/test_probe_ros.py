"""The whole deployment: probe robot and bridge as real ROS processes over DDS, checked by the test trainer.

``plugrl-probe`` (without --headless) starts the probe robot and a bridge
configured by the shipped config/probe.yaml; the test trainer runs its
scenarios against it and reports, clause by clause, what the bridge broke.
"""

from __future__ import annotations

import pytest
from harness import TrainerThread, process, python_module

from plugrl_ros.tools.test_trainer import REWARD_SUM, TERMINAL_OBSERVATION, TIME_MAJOR, TrainerSettings

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


def test_the_ros_probe_configures_its_robot_and_bridge_with_the_trainers_action_width_and_horizon():
    # no --action-dim: the probe reads the trainer's metadata before it starts the robot and the bridge
    settings = trainer_settings(script=("resync", "stop"), horizon=6, action_dim=3)
    code, report, output = run_probe(settings, "--envs", "2", "--mode", "timer", "--rate", "50")
    assert code == 0, output
    assert report.failed == 0, report.text() + output
    assert not report.incomplete, report.text() + output
    assert report.clause(TIME_MAJOR).passed >= 12, report.text()
