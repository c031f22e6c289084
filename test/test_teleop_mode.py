"""Teleop mode end to end: no trainer, a person drives the fake robot with a gamepad over real DDS, all recorded."""

from __future__ import annotations

import time

import numpy as np
import pytest
from harness import STATE, bridge, bridge_params, wait_until
from sensor_msgs.msg import Joy
from std_msgs.msg import Bool, Float64MultiArray

from plugrl_ros.record.export import main as export
from plugrl_ros.record.info import format_summary, summarize
from plugrl_ros.record.read import array, labelled, read_all

pytestmark = [pytest.mark.ros, pytest.mark.slow, pytest.mark.timeout(120)]

BUTTON = 1


def test_a_person_drives_without_trainer_or_policy_and_every_demonstration_step_is_recorded(tmp_path, robot):
    robot.stream(Float64MultiArray, "/state", lambda: Float64MultiArray(data=[time.monotonic()]), period_s=0.01)
    cmd = robot.listen(Float64MultiArray, "/cmd")
    done = robot.publisher(Bool, "/terminated")
    stick, held = [0.25], [False]
    robot.stream(Joy, "/joy", lambda: Joy(axes=[stick[0]], buttons=[0, int(held[0])]), period_s=0.05)
    params = bridge_params(
        "ws://127.0.0.1:9",  # nobody listens there: teleop mode never connects
        mode="teleop",
        observations=STATE,
        actions={
            "cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero", "max": 1.0}
        },
        episode={"terminated_topic": "/terminated", "max_steps": 40},
        intervention={"source": "joy", "joy": {"topic": "/joy", "axes": [0], "scale": 2.0, "button": BUTTON}},
        record={"path": str(tmp_path / "recording"), "flush_interval_s": 0.2},
    )

    def values(since: float) -> list[float]:
        return [m.data[0] for m in cmd.msgs(since)]

    with bridge(tmp_path, params) as child:
        t0 = time.monotonic()
        wait_until(lambda: len(values(t0)) >= 20, 30, "idle commands before the person holds the deadman")
        assert set(values(t0)) == {0.0}

        held[0] = True
        t_held = time.monotonic()
        wait_until(lambda: values(t_held).count(0.5) >= 10, 10, "the person's command")
        stick[0] = 1.0  # 2.0: clipped to the actuator's max
        t_full = time.monotonic()
        wait_until(lambda: values(t_full).count(1.0) >= 60, 10, "the clipped command, past max_steps")
        done.publish(Bool(data=True))  # the robot ends an episode
        t_done = time.monotonic()
        wait_until(lambda: values(t_done).count(1.0) >= 10, 10, "the person driving on")
        held[0] = False
        t_rest = time.monotonic()
        wait_until(lambda: values(t_rest).count(0.0) >= 10, 10, "idle once the person lets go")
        rest = values(t_rest)
        assert set(rest[rest.index(0.0) :]) == {0.0}
    assert "teleop: a person drives" in child.output()

    files = sorted((tmp_path / "recording").glob("*.mcap"))
    steps, person_commands, observations, episodes = [], [], [], []
    for _, recorded in read_all(files):
        if recorded.topic == "/plugrl/env0/intervention":
            steps.append(labelled(recorded.msg))
        elif recorded.topic == "/plugrl/env0/person_command":
            person_commands.append(array(recorded.msg).tolist())
        elif recorded.topic == "/plugrl/env0/infer/states/pos":
            observations.append(recorded)
        elif recorded.topic == "/plugrl/env0/episode":
            episodes.append(labelled(recorded.msg))
    person = [s for s in steps if s["person"]]
    assert person and len(person_commands) == len(person) == len(observations)
    assert {tuple(c) for c in person_commands} <= {(0.5,), (2.0,)}  # as given: the limits apply to what is sent
    assert [e["length"] for e in episodes[:1]] == [40.0]  # max_steps ends the first demonstration (truncated)
    assert any(e["length"] < 40 for e in episodes[1:]), "the robot's terminated flag ends a demonstration"

    # plugrl-export rebuilds the demonstrations: each tick of an episode, what the person commanded
    assert export([*map(str, files), "--to", "npz", str(tmp_path / "npz")]) == 0
    exported = [np.load(f) for f in sorted((tmp_path / "npz").glob("env0_*.npz"))]
    assert len(exported) >= 2 and [int(e["episode_length"]) for e in exported[:1]] == [40]
    first, second = exported[:2]
    assert first["step_person"].all() and len(first["step_actions"]) == 40 and first["step_truncated"][-1]
    assert all(bool(e["complete"]) for e in exported)  # no recorder call was dropped
    assert set(first["step_actions"].ravel()) <= {0.5, 2.0} and first["observations/states/pos"].shape == (40, 1)
    assert second["step_terminated"][-1] and len(second["step_actions"]) == int(second["episode_length"]) < 40
    assert float(first["episode_return"]) == pytest.approx(first["step_rewards"].sum())

    # plugrl-record-info counts the person's steps as steps, not idle ticks
    env0 = summarize(files).envs[0]
    assert env0.person_steps == len(person) and env0.steps == len(person) and env0.chunks == 0
    assert f"a person commanded {len(person)} of the steps (100%)" in format_summary(summarize(files))
