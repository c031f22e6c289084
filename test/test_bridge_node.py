"""The bridge node as a real process: over real DDS to a fake robot, over a real websocket to a scripted trainer.

Each test writes a small params file, starts ``python -m
plugrl_ros.node.bridge_main`` exactly as ``ros2 run`` would, plays the robot
with an rclpy node in this process (its own Context, spun on a background
thread) and the trainer with :class:`trainer_fixture.ScriptedTrainer`, and
checks what crossed each boundary. Timing-dependent checks wait for
conditions with a deadline; a "nothing happens" check watches for a window
measured by other traffic (a number of messages), never by a bare sleep.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import Twist
from harness import (
    BRIDGE,
    DIAG_PREFIX,
    OK,
    PERIOD_S,
    RATE_HZ,
    ROOT,
    SET_PAUSED,
    STATE,
    STOP_BOUND_S,
    VALID,
    WARN,
    Inbox,
    Robot,
    about_one_period,
    bridge,
    bridge_params,
    env_rows,
    env_status,
    first_diag,
    float_state,
    free_port,
    launch_params_file,
    merged,
    obs_of,
    of_kind,
    per_env_chunk,
    process,
    reset_retry_delays,
    state_of,
    statuses,
    wait_until,
    with_env,
    write_params,
)
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Bool, Float32, Float64, Float64MultiArray
from std_srvs.srv import SetBool, Trigger
from trainer_fixture import Record, ScriptedTrainer

from plugrl_ros.protocol.client import STOP_REASON
from plugrl_ros.ros.qos import qos_profile

# The trainer link is plumbing here, except in the tests marked websockets (closes, stops, a hung handshake).
pytestmark = [pytest.mark.ros, pytest.mark.websockets_incidental, pytest.mark.slow, pytest.mark.timeout(90)]


NO_OBSERVATIONS = {"actions": VALID["actions"]}
SLICE_TOO_WIDE = {"arm": {"topic": "cmd", "type": "sensor_msgs/JointState", "joints": ["a", "b"], "slice": [0, 3]}}


def run_with_config(tmp_path: Path, params: dict, *ros_args: str) -> tuple[int, str]:
    path = write_params(tmp_path / "bridge.yaml", params)
    with process([*BRIDGE, "--ros-args", "--params-file", str(path), *ros_args]) as child:
        return child.wait(30), child.output()


@pytest.mark.parametrize(
    ("params", "ros_args", "key", "value", "allowed"),
    [
        pytest.param(
            merged(VALID, {"control": {"rat_hz": 20.0}}),
            (),
            "control.rat_hz",
            "20.0",
            "unknown key under control; did you mean 'rate_hz'?",
            id="unknown-key",
        ),
        pytest.param(
            merged(VALID, {"control": {"rate_hz": "fast"}}),
            (),
            "control.rate_hz",
            "'fast'",
            "finite number",
            id="wrong-type",
        ),
        pytest.param(
            VALID,
            ("-p", "control.batch_window_s:=soon"),
            "control.batch_window_s",
            "'soon'",
            "finite number",
            id="wrong-type-on-command-line",
        ),
        pytest.param(
            merged(VALID, {"control": {"rate_hz": -5.0}}),
            (),
            "control.rate_hz",
            "-5.0",
            "greater than 0",
            id="negative-rate",
        ),
        pytest.param(
            merged(VALID, {"actions": SLICE_TOO_WIDE}),
            (),
            "actions.arm.slice",
            "[0, 3]",
            "must be 2",
            id="slice-too-wide",
        ),
        pytest.param(
            merged(VALID, {"observations": {"states": {"joints": {"type": "sensor_msgs/JointStat"}}}}),
            (),
            "observations.states.joints.type",
            "'sensor_msgs/JointStat'",
            "sensor_msgs/JointState",
            id="unknown-message-type",
        ),
        pytest.param(
            merged(VALID, {"envs": []}),
            (),
            "envs",
            "[]",
            "must not be empty",
            id="empty-envs",
        ),
        pytest.param(NO_OBSERVATIONS, (), "observations", "(missing)", "required", id="no-observations"),
        pytest.param(
            {"observation": VALID["observations"], "actions": VALID["actions"]},
            (),
            "observation",
            "{states: ...}",
            "unknown key under the root; did you mean 'observations'?",
            id="misspelt-section",
        ),
        pytest.param(
            merged(VALID, {"actions": {"arm": {"min": [-3, 3.1]}}}),
            (),
            "actions.arm.min",
            "[-3, 3.1]",
            "write every number with a decimal point",
            id="list-mixing-int-and-float",
        ),
        pytest.param(
            VALID,
            ("-p", "actions.arm.max:=[1, 2.5]"),
            "actions.arm.max",
            "[1, 2.5]",
            "one type per list",
            id="list-mixing-int-and-float-on-command-line",
        ),
        pytest.param(
            merged(VALID, {"trainer": {"ca_file": None}}),
            (),
            "trainer.ca_file",
            "None",
            "the key has no value",
            id="key-without-value",
        ),
        pytest.param(
            VALID,
            ("-p", "control.rate_hz:=fast"),
            "control.rate_hz",
            "'fast'",
            f"ROS 2 kept {RATE_HZ!r} instead of this value",
            id="override-of-another-type-dropped-by-ros",
        ),
        pytest.param(
            merged(VALID, {"episode": {"max_steps": 100}}),
            ("-p", "episode.max_steps:=100.5"),
            "episode.max_steps",
            "100.5",
            "ROS 2 kept 100 instead of this value",
            id="float-override-of-an-int-dropped-by-ros",
        ),
        pytest.param(
            merged(VALID, {"trainer": {"api_key_env": "PLUGRL_TEST_UNSET_KEY"}}),
            (),
            "trainer.api_key_env",
            "'PLUGRL_TEST_UNSET_KEY'",
            "the environment variable PLUGRL_TEST_UNSET_KEY is not set",
            id="api-key-variable-unset",
        ),
        pytest.param(
            merged(VALID, {"trainer": {"uri": "wss://127.0.0.1:9", "ca_file": "/nonexistent/plugrl-ca.pem"}}),
            (),
            "trainer.ca_file",
            "'/nonexistent/plugrl-ca.pem'",
            "cannot load it as a CA bundle: No such file or directory",
            id="missing-ca-file",
        ),
    ],
)
def test_a_bad_config_exits_2_naming_the_key_the_value_and_what_is_allowed(
    tmp_path, params, ros_args, key, value, allowed
):
    code, output = run_with_config(tmp_path, bridge_params("ws://127.0.0.1:9", **params), *ros_args)
    assert code == 2, output
    assert "Traceback" not in output, output
    line = next((ln for ln in output.splitlines() if "configuration error" in ln), "")
    assert f"{key}: got {value}" in line, output
    assert allowed in line, output


@pytest.mark.parametrize(
    ("text", "ros_args", "expected"),
    [
        pytest.param(None, (), "--params-file: got '{path}'; cannot read it: No such file", id="missing-file"),
        pytest.param(
            "/**:\n  ros__parameters:\n    control: {rate_hz: [1\n",
            (),
            "--params-file: got '{path}'; not valid YAML near line 3",
            id="broken-yaml",
        ),
        pytest.param(
            "/**:\n  ros_parameters:\n    control:\n      rate_hz: 20.0\n",
            (),
            "/**: got ['ros_parameters']; in {path}, a node section must hold 'ros__parameters:'",
            id="misspelt-ros-parameters",
        ),
        pytest.param(
            "bridge:\n  ros__parameters:\n    control:\n      rate_hz: 20.0\n",
            (),
            "--params-file: got ['{path}']; no section applies to this node (/plugrl_bridge); the file has 'bridge'",
            id="section-for-another-node",
        ),
        pytest.param(
            "/**:\n  ros__parameters:\n    control:\n      rate_hz: 20.0\n",
            ("--no-such-ros-flag",),
            "cannot read the command line: UnknownROSArgsError: ['--no-such-ros-flag']",
            id="unknown-ros-argument",
        ),
    ],
)
def test_a_params_file_ros_2_would_refuse_exits_2_saying_why(tmp_path, text, ros_args, expected):
    path = tmp_path / "bridge.yaml"
    if text is not None:
        path.write_text(text)
    with process([*BRIDGE, "--ros-args", "--params-file", str(path), *ros_args]) as child:
        code, output = child.wait(30), child.output()
    assert code == 2, output
    assert "Traceback" not in output, output
    assert expected.format(path=path) in output, output


def test_what_ros_2_accepts_starts_the_bridge_with_the_values_given(tmp_path):
    """No false alarm: another node's section holding [] and ~, numbers and booleans as ROS 2 reads
    them (1e2, n), a namespace nesting its node section, and the node's namespace remapped."""
    robot = tmp_path / "robot.yaml"
    robot.write_text("camera_driver:\n  ros__parameters:\n    filters: []\n    exposure: ~\n")
    lab = tmp_path / "lab.yaml"
    lab.write_text("lab:\n  plugrl_bridge:\n    ros__parameters:\n      control:\n        rate_hz: 1e2\n")
    params = bridge_params("ws://127.0.0.1:9", **merged(VALID, {"actions": {"arm": {"max_delta": 0.05}}}))
    extra = ["-r", "__ns:=/lab", "--params-file", str(robot), "--params-file", str(lab)]
    extra += ["-p", "actions.arm.max_delta:=1e-3", "-p", "trainer.use_reuse:=n"]
    with bridge(tmp_path, params, *extra) as child:
        wait_until(lambda: "env(s)" in child.output() or child.proc.poll() is not None, 30, "the bridge starting")
        assert child.proc.poll() is None, child.output()
        assert "mode timer at 100 Hz" in child.output(), "the nested section's 1e2 did not arrive"
        assert child.stop() == 0


def test_a_launch_files_inline_parameters_start_the_bridge(tmp_path):
    """The params file launch_ros writes for ``parameters=[{...}]``: lists as ``!!python/tuple``, dotted names."""
    params = bridge_params("ws://127.0.0.1:9", **merged(VALID, {"envs": ["robot1", "robot2"]}))
    path = launch_params_file(tmp_path / "launch_params_test", "/plugrl_bridge", params)
    assert "!!python/tuple" in path.read_text()
    with process([*BRIDGE, "--ros-args", "-r", "__node:=plugrl_bridge", "--params-file", str(path)]) as child:
        wait_until(lambda: "env(s)" in child.output() or child.proc.poll() is not None, 30, "the bridge starting")
        assert child.proc.poll() is None, child.output()
        assert "2 env(s): robot1, robot2" in child.output()
        assert child.stop() == 0


# -- b. the observation path -------------------------------------------------------------

POSITIONS = {"j1": 1.5, "j2": 2.5, "j3": 3.5, "extra": 99.0}
VELOCITIES = {"j1": -1.0, "j2": -2.0, "j3": -3.0, "extra": 98.0}
# 4 x 6 blocks of 2 x 2 equal pixels: an exact 2x shrink gives back one pixel per block.
BLOCKS_RGB = np.array(
    [[[200 - 10 * y - x, 100 + 10 * y + x, 10 * y + x] for x in range(6)] for y in range(4)], dtype=np.uint8
)


def bgr8_image() -> Image:
    pixels = np.repeat(np.repeat(BLOCKS_RGB[:, :, ::-1], 2, axis=0), 2, axis=1)  # 8 x 12, BGR
    msg = Image(height=8, width=12, encoding="bgr8", step=12 * 3)
    msg.data = pixels.tobytes()
    return msg


def png_image() -> CompressedImage:
    ok, encoded = cv2.imencode(".png", BLOCKS_RGB[:, :, ::-1])  # lossless: the bridge must give back BLOCKS_RGB
    assert ok
    msg = CompressedImage(format="png")
    msg.data = encoded.tobytes()
    return msg


def joint_state(order: list[str]) -> JointState:
    return JointState(name=order, position=[POSITIONS[j] for j in order], velocity=[VELOCITIES[j] for j in order])


def test_observations_reach_the_trainer_selected_converted_and_with_chunk_summed_rewards(tmp_path, robot):
    horizon = 3

    def actions(env_indices, step_ids, observation):
        chunk = np.zeros((horizon, len(env_indices), 1), dtype="<f4")
        chunk[:, :, 0] = np.arange(1, horizon + 1)[:, None]  # step k is worth reward k + 1
        return chunk

    params = {
        "observations": {
            "images": {
                "cam": {"topic": "camera/image_raw", "type": "sensor_msgs/Image", "resize": [4, 6]},
                "wrist": {"topic": "wrist/image/compressed", "type": "sensor_msgs/CompressedImage"},
            },
            "states": {
                "joints": {
                    "topic": "joint_states",
                    "type": "sensor_msgs/JointState",
                    "joints": ["j3", "j1", "j2"],
                    "fields": ["position", "velocity"],
                }
            },
            "text": {"prompt": "pick up the red block"},
        },
        "actions": {"arm": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
        "reward": {"topic": "reward", "type": "std_msgs/Float32", "sync": True},
    }
    joints = robot.stream(JointState, "/joint_states", lambda: joint_state(["j1", "j2", "j3", "extra"]))
    robot.stream(Image, "/camera/image_raw", bgr8_image)
    robot.stream(CompressedImage, "/wrist/image/compressed", png_image)
    reward = robot.publisher(Float32, "/reward")
    # the robot's reward for a step is the command it was given
    robot.listen(Float64MultiArray, "/cmd", then=lambda msg: reward.publish(Float32(data=msg.data[0])))

    with ScriptedTrainer({"action_horizon": horizon, "action_dim": 1}, actions) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            trainer.wait_for(lambda r: len(of_kind(r, "feedback")) >= 3, 20, "3 feedbacks")
            # the driver now changes its joint order on every message
            orders = [["extra", "j2", "j3", "j1"], ["j3", "extra", "j1", "j2"]]
            joints.make = lambda: joint_state(orders[joints.count % 2])
            infers_before = len(trainer.messages("infer"))
            trainer.wait_for(lambda r: len(of_kind(r, "infer")) >= infers_before + 4, 20, "4 more infers")
            records = trainer.records()

    infers, feedbacks = of_kind(records, "infer"), of_kind(records, "feedback")
    expected_state = [3.5, 1.5, 2.5, -3.0, -1.0, -2.0]  # j3, j1, j2 positions, then their velocities
    for message in infers + feedbacks:
        obs = obs_of(message)
        assert sorted(obs) == ["images", "states", "text"]
        np.testing.assert_array_equal(obs["states"]["joints"], [expected_state])
        assert obs["states"]["joints"].dtype == np.dtype("<f8")
        image = obs["images"]["cam"]
        assert image.dtype == np.uint8 and image.shape == (1, 4, 6, 3)
        np.testing.assert_array_equal(image[0], BLOCKS_RGB)  # RGB, resized to [4, 6]
        wrist = obs["images"]["wrist"]  # taken serialized, decoded from the message's bytes in place
        assert wrist.dtype == np.uint8 and wrist.shape == (1, 4, 6, 3)
        np.testing.assert_array_equal(wrist[0], BLOCKS_RGB)
        assert list(obs["text"]) == ["pick up the red block"]
    assert [int(m["step_ids"][0]) for m in infers] == list(range(len(infers)))
    for message in feedbacks:
        data = message["data"]
        assert data["rewards"].dtype == np.dtype("<f4")
        assert data["rewards"].tolist() == [1.0 + 2.0 + 3.0]  # the sum over the chunk's steps
        assert data["terminated"].tolist() == [False] and data["truncated"].tolist() == [False]


# -- c. the action path -----------------------------------------------------------------

ARM = {"start": 0, "stop": 3, "scale": [2.0, 1.0, -1.0], "offset": [0.0, 0.5, 0.0], "min": [-1.0, -1.0, -1.0]}
ARM |= {"max": [1.0, 1.0, 0.8], "max_delta": 0.25}
BASE = {"start": 3, "stop": 5, "scale": 0.5, "offset": 0.1, "min": -0.4, "max": 0.4}


def shape(raw: np.ndarray, spec: dict, last: np.ndarray | None) -> np.ndarray:
    """README's order: slice -> value * scale + offset -> clip to [min, max] -> at most max_delta from the last."""
    values = raw[spec["start"] : spec["stop"]] * np.asarray(spec["scale"]) + np.asarray(spec["offset"])
    values = np.clip(values, spec["min"], spec["max"])
    if "max_delta" in spec and last is not None:
        values = np.clip(values, last - spec["max_delta"], last + spec["max_delta"])
    return values


# Commands published before DDS matched the test's subscriber are lost: seen, 16 at 50 Hz on a loaded machine
# (the subscriber already saw the publisher in the graph; the publisher had not yet matched it).
MAX_LOST_AT_START = 30


def lost_at_start(got: np.ndarray, expected: list[np.ndarray]) -> int:
    """How many of ``expected`` were lost before ``got`` began: ``got`` must be a contiguous run of them."""
    for lost in range(min(MAX_LOST_AT_START, len(expected) - len(got)) + 1):
        if np.allclose(got, expected[lost : lost + len(got)], rtol=0, atol=1e-9):
            return lost
    return 0  # no run matches: the caller's comparison from the start shows how they differ


def moving(inbox: Inbox) -> list[Twist]:
    return [m for m in inbox.msgs() if m.linear.x or m.angular.z]


def test_actions_are_sliced_scaled_clipped_rate_limited_and_published_step_by_step_in_order(tmp_path, robot):
    horizon, chunks = 4, []

    def actions(env_indices, step_ids, observation):
        rng = np.random.default_rng(len(chunks))
        chunk = rng.uniform(-1.5, 1.5, (horizon, len(env_indices), 5)).astype("<f4")
        chunks.append(chunk)
        return chunk

    def section(spec: dict, **extra: Any) -> dict:
        keys = {k: v for k, v in spec.items() if k not in ("start", "stop")}
        return {"slice": [spec["start"], spec["stop"]], **keys, **extra}

    params = {
        "observations": STATE,
        "actions": {
            "arm": section(ARM, topic="arm_cmd", type="std_msgs/Float64MultiArray", idle="none"),
            "base": section(
                BASE, topic="cmd_vel", type="geometry_msgs/Twist", fields=["linear.x", "angular.z"], idle="zero"
            ),
        },
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    arm, base = robot.listen(Float64MultiArray, "/arm_cmd"), robot.listen(Twist, "/cmd_vel")
    with ScriptedTrainer({"action_horizon": horizon, "action_dim": 5}, actions) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            wait_until(lambda: len(arm) >= 3 * horizon, 20, "three chunks on the arm")
            wait_until(lambda: len(moving(base)) >= 3 * horizon, 10, "three chunks on the base")
            arm_steps, base_steps = arm.msgs(), moving(base)
    steps = np.concatenate([c[:, 0, :] for c in chunks]).astype(np.float64)  # every chunk, time-major, in order
    # the arm publishes nothing while idle, so max_delta carries over from one chunk to the next
    expected_arm, last, unlimited = [], None, []
    for raw in steps:
        unlimited.append(shape(raw, {**ARM, "max_delta": math.inf}, last))
        last = shape(raw, ARM, last)
        expected_arm.append(last)
    got_arm = np.array([m.data for m in arm_steps[: 3 * horizon]])
    lost = lost_at_start(got_arm, expected_arm)
    np.testing.assert_allclose(got_arm, expected_arm[lost : lost + 3 * horizon], rtol=0, atol=1e-9)
    assert not np.allclose(unlimited[lost : lost + 3 * horizon], got_arm), "the chunks never exercised max_delta"
    # the base idles with zeros between chunks: its chunk steps are its non-zero commands
    expected_base = [shape(raw, BASE, None) for raw in steps]
    got_base = np.array([[m.linear.x, m.angular.z] for m in base_steps[: 3 * horizon]])
    lost = lost_at_start(got_base, expected_base)
    np.testing.assert_allclose(got_base, expected_base[lost : lost + 3 * horizon], rtol=0, atol=1e-9)
    assert np.any(np.abs(got_base) == 0.4), "the chunks never exercised min/max"
    for m in base.msgs():
        assert (m.linear.y, m.linear.z, m.angular.x, m.angular.y) == (0.0, 0.0, 0.0, 0.0)


@pytest.mark.websockets
def test_a_non_finite_action_closes_the_connection_and_none_of_its_chunk_is_published(tmp_path, robot):
    infers = []

    def actions(env_indices, step_ids, observation):
        infers.append(env_indices)
        chunk = np.full((3, len(env_indices), 1), 0.5, dtype="<f4")
        if len(infers) == 3:  # the third chunk holds a NaN in its second step
            chunk[:, :, 0] = [[0.7], [np.nan], [0.7]]
        return chunk

    params = {
        "observations": STATE,
        "actions": {"arm": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    cmd = robot.listen(Float64MultiArray, "/cmd")
    with ScriptedTrainer({"action_horizon": 3, "action_dim": 1}, actions) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            code, reason = trainer.wait_closed(0, 20)
            trainer.wait_for(lambda r: of_kind(r, "feedback", connection=1), 20, "a feedback after reconnecting")
            wait_until(lambda: len(cmd) >= 9, 10, "commands after reconnecting")
    assert code == 1002, (code, reason)
    values = [v for m in cmd.msgs() for v in m.data]
    assert all(math.isfinite(v) for v in values), values
    assert 0.7 not in values, "a step of the chunk holding NaN reached the actuator"
    assert set(values) == {0.5}


# -- d. idle behaviours ------------------------------------------------------------------


def median_stamp_interval(msgs: list[JointState]) -> float:
    """The median time between the stamps the bridge put on ``msgs``: its tick period, free of delivery jitter."""
    stamps = [m.header.stamp.sec + m.header.stamp.nanosec * 1e-9 for m in msgs]
    return statistics.median(b - a for a, b in itertools.pairwise(stamps))


def test_idle_actuators_publish_zeros_hold_the_last_command_or_stay_silent_without_a_trainer(tmp_path, robot):
    port = free_port()
    params = {
        "observations": STATE,
        "actions": {
            "zeroed": {
                "topic": "cmd_zero",
                "type": "sensor_msgs/JointState",
                "joints": ["wheel_l", "wheel_r"],
                "field": "velocity",
                "idle": "zero",
            },
            "held": {"topic": "cmd_hold", "type": "std_msgs/Float64MultiArray", "slice": [0, 2], "idle": "hold"},
            "silent": {"topic": "cmd_none", "type": "std_msgs/Float64", "slice": [0, 1], "idle": "none"},
        },
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    zeroed, held = robot.listen(JointState, "/cmd_zero"), robot.listen(Float64MultiArray, "/cmd_hold")
    silent = robot.listen(Float64, "/cmd_none")

    def chunk(env_indices, step_ids, observation):
        return np.tile(np.array([0.3, -0.6], dtype="<f8"), (2, len(env_indices), 1))

    with bridge(tmp_path, bridge_params(f"ws://127.0.0.1:{port}", **params)):
        # before any trainer: zeros at the control rate; nothing to hold yet; silence
        wait_until(lambda: len(zeroed) >= 20, 20, "idle zeros before the trainer connects")
        assert all(list(m.velocity) == [0.0, 0.0] for m in zeroed.msgs())
        assert about_one_period(median_stamp_interval(zeroed.msgs()))
        assert len(held) == 0 and len(silent) == 0

        trainer = ScriptedTrainer({"action_horizon": 2, "action_dim": 2}, chunk, port=port).start()
        try:
            trainer.wait_for(lambda r: len(of_kind(r, "feedback")) >= 3, 20, "3 feedbacks")
            assert [0.3, -0.6] in [list(m.velocity) for m in zeroed.msgs()]
            assert [0.3, -0.6] in [list(m.data) for m in held.msgs()]
            assert 0.3 in [m.data for m in silent.msgs()]

            trainer.actions = lambda *args: None  # from now on, infers go unanswered
            trainer.close(1011, "Internal server error.")
            trainer.wait_for(lambda r: of_kind(r, "infer", connection=1), 20, "an infer after reconnecting")
            mark, silent_before = time.monotonic(), len(silent)
            wait_until(lambda: len(zeroed.msgs(mark)) >= 20, 10, "idle zeros after the close")
            assert all(list(m.velocity) == [0.0, 0.0] for m in zeroed.msgs(mark))
            assert about_one_period(median_stamp_interval(zeroed.msgs(mark)))
            holding = held.msgs(mark)
            assert len(holding) >= 10, "hold must republish the last command at the control rate"
            assert all(list(m.data) == pytest.approx([0.3, -0.6]) for m in holding)
            assert len(silent) == silent_before, "idle none published while idle"
        finally:
            trainer.stop()


# -- e. several envs -----------------------------------------------------------------------


def test_each_env_reads_and_commands_its_own_namespace(tmp_path, robot):
    params = {
        "envs": ["robot1", "robot2"],
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
        # started paused until both robots are heard, so that the first infer batches both envs
        "pause": {"start_paused": True},
    }
    robot.stream(Float64MultiArray, "/robot1/state", float_state(1.0))
    robot.stream(Float64MultiArray, "/robot2/state", float_state(2.0))
    cmds = [robot.listen(Float64MultiArray, "/robot1/cmd"), robot.listen(Float64MultiArray, "/robot2/cmd")]
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    with ScriptedTrainer({"action_horizon": 3, "action_dim": 1}, per_env_chunk(3)) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            first_diag(
                diagnostics,
                lambda m: env_status(m, 0)[1] == env_status(m, 1)[1] == "paused",
                20,
                "both envs observing (and paused)",
            )
            assert not trainer.messages("infer"), "an infer went out while paused"
            robot.call(SetBool, SET_PAUSED, SetBool.Request(data=False))
            wait_until(lambda: all(len(c) >= 6 for c in cmds), 20, "two chunks on each robot")
            infers = trainer.messages("infer")
    assert infers[0]["env_indices"].tolist() == [0, 1]
    for message in infers:
        for env in env_rows(message):
            assert state_of(message, env).tolist() == [env + 1.0], "an env observed another namespace's topic"
    # time-major: step k of env e is action[k, row of e]; each robot gets its env's steps, in order
    for env, inbox in enumerate(cmds):
        assert [m.data[0] for m in inbox.msgs()[:6]] == [100.0 * (env + 1) + k for k in (0, 1, 2, 0, 1, 2)]


def test_diagnostics_report_the_uplink_bytes_per_env_step(tmp_path, robot):
    # With the step rate, this tells an operator on a capped uplink that the link, not the robot, is the limit.
    params = {
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
    }
    robot.stream(Float64MultiArray, "/state", float_state(1.0))
    robot.listen(Float64MultiArray, "/cmd")  # its driver: no chunk starts before the actuator has a subscriber
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")

    def per_step(msg: DiagnosticArray) -> str:
        return statuses(msg).get(f"{DIAG_PREFIX}: trainer", (0, "", {}))[2].get("bytes sent per env step", "-")

    with ScriptedTrainer({"action_horizon": 3, "action_dim": 1}, per_env_chunk(3)) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            _, msg = first_diag(diagnostics, lambda m: per_step(m) != "-", 30, "a bytes-per-step figure")
    # an infer and a feedback per 3-step chunk, each at least a msgpack map with the state: tens of bytes a step
    assert 10 < float(per_step(msg).replace(",", "")) < 100_000, per_step(msg)


# -- f. a stale sensor -----------------------------------------------------------------------


def test_a_silent_sensor_idles_its_env_only_and_its_next_infer_carries_fresh_data(tmp_path, robot):
    params = {
        "envs": ["robot1", "robot2"],
        "observations": {"states": {"pos": {"topic": "state", "type": "std_msgs/Float64MultiArray", "max_age_s": 0.5}}},
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero"}},
    }
    robot.stream(Float64MultiArray, "/robot1/state", float_state(1.0))
    sensor2 = robot.stream(Float64MultiArray, "/robot2/state", float_state(2.0))
    cmd1, cmd2 = robot.listen(Float64MultiArray, "/robot1/cmd"), robot.listen(Float64MultiArray, "/robot2/cmd")
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")

    def stepping(inbox: Inbox, since: float, n: int) -> bool:
        return sum(1 for m in inbox.msgs(since) if m.data[0] != 0.0) >= n

    with ScriptedTrainer({"action_horizon": 3, "action_dim": 1}, per_env_chunk(3)) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            wait_until(lambda: stepping(cmd1, 0, 3) and stepping(cmd2, 0, 3), 20, "both envs stepping")

            t_silent = time.monotonic()
            sensor2.on = False
            t_stale, diag = first_diag(
                diagnostics,
                lambda m: env_status(m, 1)[0] == WARN and "stale" in env_status(m, 1)[1],
                10,
                "/diagnostics to report env 1 stale",
                since=t_silent,
            )
            assert env_status(diag, 0)[0] == OK, env_status(diag, 0)
            assert "robot2/state" in env_status(diag, 1)[1]
            # env 0 keeps stepping while env 1 idles
            wait_until(lambda: stepping(cmd1, t_stale, 9), 10, "env 0 stepping while env 1 is stale")
            silent_window = cmd2.msgs(t_stale + 0.05)
            assert len(silent_window) >= 5, "idle zero must keep publishing for the stale env"
            assert all(m.data[0] == 0.0 for m in silent_window), "the stale env stepped"

            t_back = time.monotonic()
            sensor2.make = float_state(3.0)
            sensor2.on = True
            wait_until(lambda: stepping(cmd2, t_back, 3), 10, "env 1 stepping again")
            infer_back = trainer.wait_for(
                lambda r: next((m for t, m in with_env(trainer.timed_records(), "infer", 1) if t > t_back), None),
                10,
                "an infer for env 1 after the sensor returned",
            )
            records = trainer.timed_records()
    assert state_of(infer_back, 1).tolist() == [3.0], "the stale observation was sent as current"
    assert not [t for t, _ in with_env(records, "infer", 1) if t_stale < t < t_back], "env 1 inferred while stale"
    assert all(state_of(m, 1).tolist() == [3.0] for t, m in with_env(records, "infer", 1) if t > t_back)


# -- g. pause ----------------------------------------------------------------------------------


def first_after(trainer: ScriptedTrainer, kind: str, since: float) -> Callable[[list[Record]], dict | None]:
    """A ``wait_for`` predicate: the first message of ``kind`` the trainer received after ``since``."""
    return lambda _: next((m for t, _, m in trainer.timed_records() if t > since and m["message_type"] == kind), None)


def test_pausing_idles_the_actuators_truncates_the_running_episode_and_unpausing_resumes(tmp_path, robot):
    horizon = 25  # half a second per chunk: the pause lands mid-chunk
    params = {
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero"}},
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    cmd = robot.listen(Float64MultiArray, "/cmd")

    def ones(env_indices, step_ids, observation):
        return np.ones((horizon, len(env_indices), 1), dtype="<f4")

    def moving(since: float) -> int:
        return sum(1 for m in cmd.msgs(since) if m.data[0] != 0.0)

    with ScriptedTrainer({"action_horizon": horizon, "action_dim": 1}, ones) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            robot.discover(SetBool, SET_PAUSED)
            n = len(trainer.records())
            trainer.wait_for(lambda r: of_kind(r[n:], "infer"), 20, "an infer")
            t_infer = time.monotonic()
            wait_until(lambda: moving(t_infer) >= 3, 10, "its chunk running")

            t_pause = time.monotonic()
            answer = robot.call(SetBool, SET_PAUSED, SetBool.Request(data=True))
            t_paused = time.monotonic()  # the bridge has applied the pause
            assert answer.success and answer.message == "paused"
            truncated = trainer.wait_for(first_after(trainer, "feedback", t_pause), 5, "the paused chunk's feedback")
            # (commands published before the pause may still be on their way for a moment)
            wait_until(lambda: len(cmd.msgs(t_paused + 0.05)) >= 10, 10, "commands while paused")
            assert all(m.data[0] == 0.0 for m in cmd.msgs(t_paused + 0.05)), "an actuator moved while paused"
            assert first_after(trainer, "infer", t_pause)(None) is None, "an infer went out while paused"

            t_resume = time.monotonic()
            answer = robot.call(SetBool, SET_PAUSED, SetBool.Request(data=False))
            assert answer.success and answer.message == "running"
            resumed = trainer.wait_for(first_after(trainer, "infer", t_resume), 10, "an infer after resuming")
            wait_until(lambda: moving(t_resume) >= 3, 10, "the actuator moving again")
    data = truncated["data"]
    assert data["truncated"].tolist() == [True] and data["terminated"].tolist() == [False]
    episode = data["info"]["episode"]
    assert episode["mask"].tolist() == [True]
    steps_of_this_chunk = int(episode["l"][0]) - horizon * int(truncated["step_ids"][0])
    assert 1 <= steps_of_this_chunk < horizon, "the chunk was not cut by the pause"
    assert resumed["step_ids"].tolist() == [0], "after a truncation the next infer starts a new episode"


def test_a_dead_man_pause_topic_runs_the_robot_only_while_it_keeps_saying_false(tmp_path, robot):
    max_age = 0.3
    horizon = 500  # ten seconds per chunk: no chunk ends by itself while the test watches
    params = {
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero"}},
        "pause": {"topic": "enable_held", "max_age_s": max_age},
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    cmd = robot.listen(Float64MultiArray, "/cmd")
    switch = robot.stream(Bool, "/enable_held", lambda: Bool(data=False), period_s=0.05)
    switch.on = False  # the operator has not pressed it yet

    def moving(since: float) -> int:
        return sum(1 for m in cmd.msgs(since) if m.data[0] != 0.0)

    def after_first_idle(since: float) -> list[float] | None:
        """The commands from the first idle one received after ``since`` on (None: no idle one yet).

        One publisher's commands arrive in order, so whatever the machine's load, the commands
        still on their way when the robots stopped come before it.
        """
        values = [m.data[0] for m in cmd.msgs(since)]
        return values[values.index(0.0) :] if 0.0 in values else None

    ones = lambda envs, steps, obs: np.ones((horizon, len(envs), 1), dtype="<f4")  # noqa: E731
    with ScriptedTrainer({"action_horizon": horizon, "action_dim": 1}, ones) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            t_start = time.monotonic()
            wait_until(lambda: len(cmd.msgs(t_start)) >= 50, 20, "idle commands before the switch is held")
            assert moving(0.0) == 0 and not trainer.messages("infer"), "the robot ran before the switch said run"

            switch.on = True
            t_held = time.monotonic()
            wait_until(lambda: moving(t_held) >= 10, 10, "the actuator moving while the switch is held")

            switch.on = False  # the teleop node dies, or the operator lets go
            t_released = time.monotonic()
            # the chunk runs ten seconds: only the switch's silence can end it within five
            truncated = trainer.wait_for(first_after(trainer, "feedback", t_released), 5, "the released chunk's end")
            wait_until(
                lambda: len(after_first_idle(t_released) or []) >= 10, 10, "commands after the switch went silent"
            )
            silent = after_first_idle(t_released)
            assert set(silent) == {0.0}, "the actuator moved after the dead-man switch went silent"

            switch.on = True
            t_again = time.monotonic()
            wait_until(lambda: moving(t_again) >= 3, 10, "the actuator moving again once the switch is held")

            # The bridge stalls while the switch is held; the operator lets go meanwhile. The "run"
            # messages queued during the stall are old when it resumes: they must not move the robot.
            # (The sleeps are the fault's timing: the operator lets go 0.2 s into a 1.2 s stall.)
            os.kill(child.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(0.2)
                switch.on = False
                time.sleep(1.0)
            finally:
                os.kill(child.proc.pid, signal.SIGCONT)
            t_resumed = time.monotonic()
            wait_until(lambda: len(after_first_idle(t_resumed) or []) >= 20, 10, "idle commands after the stall")
            # at most the step or two the bridge had published just before it stopped, then only idle
            assert moving(t_resumed) <= 2, "old 'run' messages moved the robot after a stall"
            assert set(after_first_idle(t_resumed)) == {0.0}, "old 'run' messages moved the robot after a stall"
    assert truncated["data"]["truncated"].tolist() == [True], "the running episode was not truncated"


def test_in_lockstep_pausing_and_stopping_send_a_simulator_no_idle_commands(tmp_path, robot):
    # A simulator in lockstep steps on every command: an idle command would be a step nobody counted.
    params = {
        "control": {"mode": "lockstep"},
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero"}},
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    cmd = robot.listen(Float64MultiArray, "/cmd")
    ones = lambda envs, steps, obs: np.ones((4, len(envs), 1), dtype="<f4")  # noqa: E731
    with ScriptedTrainer({"action_horizon": 4, "action_dim": 1}, ones) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            robot.discover(SetBool, SET_PAUSED)
            trainer.wait_for(lambda r: len(of_kind(r, "feedback")) >= 3, 20, "3 feedbacks")
            robot.call(SetBool, SET_PAUSED, SetBool.Request(data=True))
            t_paused = time.monotonic()
            trainer.wait_for(first_after(trainer, "feedback", t_paused - 1.0), 5, "the paused chunk's feedback")
            child.stop()
            settled = time.monotonic()
    assert cmd.msgs(), "the chunks were not executed"
    assert all(m.data[0] == 1.0 for m in cmd.msgs()), "an idle (zero) command reached the simulator"
    assert settled > t_paused


def test_an_action_that_arrives_while_paused_is_dropped_with_the_connection_at_the_deadline(tmp_path, robot):
    # A feedback needs at least one step, and a paused robot takes none: the only
    # protocol-correct way to drop that chunk is to reopen the connection.
    delay = 3.0  # the action comes 3 s after its infer: the pause (a service call) lands well before, loaded or not
    params = {
        "control": {"feedback_deadline_s": 0.5},
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero"}},
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    cmd = robot.listen(Float64MultiArray, "/cmd")
    with ScriptedTrainer(
        {"action_horizon": 3, "action_dim": 1}, lambda envs, steps, obs: np.full((3, len(envs), 1), 7.0)
    ) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            robot.discover(SetBool, SET_PAUSED)
            trainer.wait_for(lambda r: len(of_kind(r, "feedback")) >= 2, 20, "2 feedbacks")
            trainer.answer_delay_s = delay  # the next action arrives a second after its infer
            n = len(trainer.records())
            trainer.wait_for(lambda r: of_kind(r[n:], "infer"), 10, "the next infer")
            t_infer = time.monotonic()
            robot.call(SetBool, SET_PAUSED, SetBool.Request(data=True))
            paused_at = len(cmd.msgs())
            assert time.monotonic() - t_infer < delay / 2, "the pause came too late: the action was already there"
            connection = trainer.connections - 1
            code, _ = trainer.wait_closed(connection, delay + 5.0)
            assert code == 1000, "the connection holding the unrun action was not closed cleanly"
            trainer.wait_for(lambda r: trainer.connections > connection + 1, 10, "a new connection")
            while_paused = cmd.msgs()[paused_at:]
    assert while_paused and all(m.data[0] == 0.0 for m in while_paused), "only idle zeros while paused"


# -- h. resets ---------------------------------------------------------------------------------


def test_a_failing_reset_is_retried_with_backoff_while_the_other_env_keeps_training(tmp_path, robot):
    params = {
        "envs": ["robot1", "robot2"],
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
        "episode": {"max_steps": 4},
        "reset": {"mode": "service", "timeout_s": 1.0, "retry_initial_s": 0.2, "retry_max_s": 1.0},
    }
    calls: dict[int, list[tuple[float, bool]]] = {0: [], 1: []}  # (when, answered success)
    arm_home = {0: False, 1: True}  # robot1's reset fails until the test lets it succeed

    def reset_service(env: int) -> Callable:
        def handle(request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
            response.success = arm_home[env]
            response.message = "ok" if response.success else "the arm is not home yet"
            calls[env].append((time.monotonic(), response.success))
            return response

        return handle

    robot.node.create_service(Trigger, "/robot1/reset", reset_service(0))
    robot.node.create_service(Trigger, "/robot2/reset", reset_service(1))
    robot.stream(Float64MultiArray, "/robot1/state", float_state(1.0))
    robot.stream(Float64MultiArray, "/robot2/state", float_state(2.0))
    cmd1, cmd2 = robot.listen(Float64MultiArray, "/robot1/cmd"), robot.listen(Float64MultiArray, "/robot2/cmd")
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")

    def env1_trained_since(t: float) -> bool:
        feedbacks = [u for u, _ in with_env(trainer.timed_records(), "feedback", 1) if u > t]
        return len(cmd2.msgs(t)) >= 10 and len(feedbacks) >= 4

    with ScriptedTrainer({"action_horizon": 2, "action_dim": 1}, per_env_chunk(2)) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            # robot1 fails (4 calls: every backoff delay up to retry_max_s) while robot2 keeps training
            wait_until(lambda: len(calls[0]) >= 4, 30, "four reset calls for robot1")
            first = calls[0][0][0]
            wait_until(lambda: env1_trained_since(first), 30, "robot2 training while robot1's reset fails")
            _, failing = first_diag(
                diagnostics,
                lambda m: "the arm is not home yet" in env_status(m, 0)[1],
                5,
                "/diagnostics to report the failing reset's answer",
            )
            wait_until(
                lambda: diagnostics.msgs() and int(env_status(diagnostics.msgs()[-1], 0)[2]["reset failures"]) >= 4,
                5,
                "the reset failure count",
            )
            arm_home[0] = True  # the next call succeeds
            succeeded = wait_until(lambda: next((t for t, ok in calls[0] if ok), None), 10, "robot1's reset to succeed")
            resumed = trainer.wait_for(
                lambda r: next((m for t, m in with_env(trainer.timed_records(), "infer", 0) if t > succeeded), None),
                10,
                "env 0 inferring after its reset succeeded",
            )
            output = child.output()
    until_success = [t for t, _ in calls[0] if t <= succeeded]  # later calls: the next episodes' resets
    # What the backoff decided (retry_initial_s 0.2, doubling, at most retry_max_s 1.0), in the bridge's
    # words: exact under any load. A service discovered late must not have used up its first delays.
    delays = reset_retry_delays(output, "robot1/reset")
    assert delays[:4] == [0.2, 0.4, 0.8, 1.0] and set(delays[4:]) <= {1.0}, delays
    # ...and honoured: a retry never comes before its delay has passed (load only makes it later)
    # (a call lost on its way would time out and shift the pairs to longer gaps and shorter delays: still true)
    gaps = [b - a for a, b in itertools.pairwise(until_success)]
    assert len(gaps) >= 4 and all(gap >= delay for gap, delay in zip(gaps, delays, strict=False)), (gaps, delays)
    level, message, _ = env_status(failing, 0)
    assert level == WARN and message.startswith("reset failing ("), message
    assert resumed["step_ids"][env_rows(resumed)[0]] == 0
    assert len(cmd1.msgs(first)) == len(cmd1.msgs(succeeded)), "robot1 was commanded while its reset was failing"
    assert env1_trained_since(first), "robot2 did not keep training"


def test_a_missing_reset_service_is_reported_called_as_soon_as_it_appears_and_backs_off_from_its_first_failure(
    tmp_path, robot
):
    params = {
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
        "episode": {"max_steps": 2},
        "reset": {"mode": "service", "timeout_s": 1.0, "retry_initial_s": 0.1, "retry_max_s": 1.0},
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    robot.listen(Float64MultiArray, "/cmd")  # its driver: no chunk starts before the actuator has a subscriber
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    calls: list[float] = []

    def handle(request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        calls.append(time.monotonic())
        response.success = len(calls) > 1  # the robot's first reset after it came up fails
        return response

    with ScriptedTrainer({"action_horizon": 2, "action_dim": 1}) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            _, missing = first_diag(
                diagnostics,
                lambda m: "not available" in env_status(m, 0)[1] and int(env_status(m, 0)[2]["reset failures"]) >= 2,
                20,
                "/diagnostics to report the missing reset service, twice",
            )
            assert env_status(missing, 0)[0] == WARN
            assert "the reset service reset is not available" in env_status(missing, 0)[1]
            infers_before = len(trainer.messages("infer"))
            robot.node.create_service(Trigger, "/reset", handle)
            wait_until(lambda: len(calls) >= 2, 10, "the reset service to be called, and called again")
            after = trainer.wait_for(
                lambda r: of_kind(r, "infer")[infers_before:],
                10,
                "an infer after the reset",
            )[0]
            output = child.output()
    assert after["step_ids"].tolist() == [0], "a new episode starts after the reset"
    # Waiting for the service is no failed call: its first failed call waits retry_initial_s.
    assert reset_retry_delays(output, "reset")[:1] == [0.1], output
    assert "not available after 1 s; calling it as soon as it appears" in output, output


# -- i, j. stopping -----------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_idles_the_actuators_closes_the_trainer_link_with_1000_and_exits_0(tmp_path, robot, signum):
    params = {
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero"}},
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    cmd = robot.listen(Float64MultiArray, "/cmd")

    def long_chunk(env_indices, step_ids, observation):
        return np.full((500, len(env_indices), 1), 0.5, dtype="<f4")  # ten seconds of motion

    with ScriptedTrainer({"action_horizon": 500, "action_dim": 1}, long_chunk) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            wait_until(lambda: sum(m.data[0] == 0.5 for m in cmd.msgs()) >= 5, 20, "the chunk running")
            t_signal = time.monotonic()
            child.proc.send_signal(signum)
            code = child.wait(10)
            elapsed = time.monotonic() - t_signal
            close = trainer.wait_closed(0, 5)
            wait_until(lambda: cmd.msgs(t_signal) and cmd.msgs()[-1].data[0] == 0.0, 5, "a zero command at the end")
            output = child.output()
    assert code == 0, output
    assert elapsed < STOP_BOUND_S, f"took {elapsed:.1f} s to stop"
    assert close[0] == 1000, close
    assert "Traceback" not in output, output


@pytest.mark.websockets
def test_sigint_exits_promptly_while_the_trainer_handshake_hangs(tmp_path, robot):
    params = {
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero"}},
    }
    cmd = robot.listen(Float64MultiArray, "/cmd")
    with socket.socket() as mute:  # accepts TCP connections, never answers the HTTP upgrade
        mute.bind(("127.0.0.1", 0))
        mute.listen(4)
        mute.settimeout(20)
        uri = f"ws://127.0.0.1:{mute.getsockname()[1]}"
        with bridge(tmp_path, bridge_params(uri, **params)) as child:
            connection, _ = mute.accept()
            with connection:
                wait_until(lambda: len(cmd) >= 3, 20, "the control loop running (idle zeros)")
                t_signal = time.monotonic()
                child.proc.send_signal(signal.SIGINT)
                code = child.wait(20)
                elapsed = time.monotonic() - t_signal
    assert code == 0
    assert elapsed < STOP_BOUND_S, f"took {elapsed:.1f} s to stop"


@pytest.mark.websockets
def test_the_trainers_stop_ends_the_bridge_with_exit_code_0(tmp_path, robot):
    params = {
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    robot.listen(Float64MultiArray, "/cmd")  # its driver: no chunk starts before the actuator has a subscriber
    with ScriptedTrainer({"action_horizon": 2, "action_dim": 1}) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            trainer.wait_for(lambda r: len(of_kind(r, "feedback")) >= 2, 20, "2 feedbacks")
            trainer.close(1001, STOP_REASON)
            code = child.wait(10)
            output = child.output()
        assert trainer.connections == 1, "the bridge reconnected after the run finished"
    assert code == 0, output
    assert "finished the run" in output


@pytest.mark.websockets
def test_with_wait_for_next_run_the_trainers_stop_makes_the_bridge_reconnect(tmp_path, robot):
    params = {
        "trainer": {"wait_for_next_run": True},
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    robot.listen(Float64MultiArray, "/cmd")  # its driver: no chunk starts before the actuator has a subscriber
    with ScriptedTrainer({"action_horizon": 2, "action_dim": 1}) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            trainer.wait_for(lambda r: len(of_kind(r, "feedback")) >= 2, 20, "2 feedbacks")
            trainer.close(1001, STOP_REASON)
            trainer.wait_for(lambda r: of_kind(r, "feedback", connection=1), 20, "the next run's first feedback")
            assert child.proc.poll() is None, "the bridge exited instead of waiting for the next run"
            assert child.stop() == 0


# -- k. simulated time ---------------------------------------------------------------------------


class SimClock:
    """A simulator's /clock: republished every ``wall_period_s``; it advances by ``step_s`` per message while
    ``running``, and by :meth:`advance` (published at once) otherwise."""

    def __init__(self, robot: Robot, wall_period_s: float = 0.005, step_s: float = 0.01) -> None:
        self.ns = 1_000_000_000
        self.step_ns = round(step_s * 1e9)
        self.running = False
        self.published = 0
        self._lock = threading.Lock()  # time must never run backwards between the two publishing threads
        self._pub = robot.node.create_publisher(Clock, "/clock", qos_profile("reliable", 10))
        robot.node.create_timer(wall_period_s, self._tick)

    def _publish(self) -> None:
        msg = Clock()
        msg.clock.sec, msg.clock.nanosec = divmod(self.ns, 1_000_000_000)
        self._pub.publish(msg)
        self.published += 1

    def _tick(self) -> None:
        with self._lock:
            if self.running:
                self.ns += self.step_ns
            self._publish()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.ns += round(seconds * 1e9)
            self._publish()

    def republished(self, n: int) -> Callable[[], bool]:
        """A condition: the clock has been published ``n`` more times from now."""
        target = self.published + n
        return lambda: self.published >= target


def test_with_use_sim_time_the_control_loop_ticks_once_per_period_of_the_clock_topic(tmp_path, robot):
    params = {
        "observations": {"states": {"pos": {"topic": "state", "type": "std_msgs/Float64MultiArray", "max_age_s": 0.0}}},
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero"}},
    }
    clock = SimClock(robot)
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    cmd = robot.listen(Float64MultiArray, "/cmd")  # idle zero: exactly one message per control tick

    def ones(env_indices, step_ids, observation):
        return np.ones((5, len(env_indices), 1), dtype="<f4")

    with ScriptedTrainer({"action_horizon": 5, "action_dim": 1}, ones) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params), "-p", "use_sim_time:=true"):
            clock.running = True
            wait_until(lambda: sum(m.data[0] == 1.0 for m in cmd.msgs()) >= 5, 20, "steps while the clock runs")

            clock.running = False  # the simulation pauses (its clock is still published)
            wait_until(clock.republished(10), 5, "the paused clock")
            ticks, messages = len(cmd), len(trainer.records())
            wait_until(clock.republished(60), 5, "the paused clock, some more")
            assert len(cmd) == ticks, "the control loop ticked while simulated time stood still"
            assert len(trainer.records()) == messages, "the bridge stepped while simulated time stood still"

            for k in range(1, 26):  # the simulation steps by one control period at a time
                clock.advance(PERIOD_S)
                wait_until(lambda k=k: len(cmd) >= ticks + k, 5, f"tick {k} of simulated time")
            wait_until(clock.republished(20), 5, "the paused clock after stepping")
            ran = cmd.msgs()[ticks:]
    assert len(ran) == 25, "not exactly one tick per control period of simulated time"
    assert sum(m.data[0] == 1.0 for m in ran) >= 15, "the env did not step in simulated time"


def test_with_use_sim_time_the_achieved_rate_is_measured_in_simulated_time(tmp_path, robot):
    params = {
        "observations": {"states": {"pos": {"topic": "state", "type": "std_msgs/Float64MultiArray", "max_age_s": 0.0}}},
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero"}},
    }
    clock = SimClock(robot, wall_period_s=0.01, step_s=0.005)  # half real time
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    with bridge(tmp_path, bridge_params("ws://127.0.0.1:9", **params), "-p", "use_sim_time:=true"):
        clock.running = True
        # diagnostics come every 0.2 s of simulated time; skip the first second of it
        _, diag = first_diag(diagnostics, lambda m: m.header.stamp.sec >= 3, 20, "diagnostics after 2 s of sim time")
    level, message, control = statuses(diag)[f"{DIAG_PREFIX}: control"]
    # measured on the wall clock it would be half the rate (the simulation runs at half real time)
    assert float(control["loop rate Hz"]) == pytest.approx(RATE_HZ, rel=0.2), control
    # On a loaded machine the bridge can miss ticks (rcl skips a missed period, in simulated time too: CI
    # measured 44.8 Hz once), which rightly warns "below 50 Hz". No other warning may come (no "waiting").
    assert level == OK or message.startswith("control loop at"), message


# -- l. /diagnostics --------------------------------------------------------------------------------


def test_diagnostics_report_the_link_the_achieved_control_rate_and_each_envs_episodes(tmp_path, robot):
    params = {
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
        "reward": {"topic": "reward", "type": "std_msgs/Float32", "sync": True},
        "episode": {"max_steps": 4},
        # not a multiple of the control period: the reports fall on every phase of an episode
        "status": {"diagnostics_period_s": 0.07, "log_period_s": 0.0},
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    reward = robot.publisher(Float32, "/reward")
    robot.listen(Float64MultiArray, "/cmd", then=lambda msg: reward.publish(Float32(data=1.0)))
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    with ScriptedTrainer({"action_horizon": 2, "action_dim": 1}) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            _, latest = first_diag(
                diagnostics, lambda m: int(env_status(m, 0)[2]["episodes"]) >= 30, 20, "30 episodes on /diagnostics"
            )
            assert trainer.messages("feedback")
    # Once it steps, a healthy env is never WARN, not even at an episode's end, where its observation is not
    # fresh until the robot's next message (an earlier bridge said "stale" from then until the bridge observed
    # again, and where the episodes kept step with the reports, it said so in every report).
    stepping = [
        (level, message) for level, message, env in (env_status(m, 0) for m in diagnostics.msgs()) if int(env["steps"])
    ]
    assert stepping and all(level == OK for level, _ in stepping), [m for m in stepping if m[0] != OK]
    names = statuses(latest)
    trainer_level, _, link = names[f"{DIAG_PREFIX}: trainer"]
    assert trainer_level == OK and link["connected"] == "True"
    assert 0.0 < float(link["infer round trip median ms"]) < 1000.0, link
    _, _, control = names[f"{DIAG_PREFIX}: control"]
    assert control["mode"] == "timer" and control["target rate Hz"] == "50", control
    # achieved, not the target: a loaded machine runs the loop slower (seen: 32 Hz of 50), never faster
    assert 0.0 < float(control["loop rate Hz"]) <= 1.2 * RATE_HZ, control
    level, message, env = names[f"{DIAG_PREFIX}: env 0 (no namespace)"]
    assert level == OK, message
    assert env["last return"] == "4.000", env  # four steps of reward 1.0
    assert int(env["steps"]) >= 8, env
    assert 0.0 < float(env["step rate Hz"]) <= 1.2 * RATE_HZ, env  # env steps, not loop ticks
    assert float(control["env step rate Hz"]) == pytest.approx(float(env["step rate Hz"]), abs=0.05), control


def test_no_chunk_starts_until_the_robot_subscribes_to_every_actuator_and_then_no_command_is_lost(tmp_path, robot):
    """DDS needs a moment to match a new publisher with the robot's subscriber; until then a command reaches
    nobody, while the trainer would count its step. The bridge asks for no chunk before every actuator topic
    has a subscriber, so the robot gets each step of every chunk from the very first."""
    horizon, chunks = 3, []

    def actions(env_indices, step_ids, observation):
        chunk = np.arange(len(chunks) * horizon, (len(chunks) + 1) * horizon, dtype="<f4").reshape(horizon, 1, 1)
        chunks.append(chunk)
        return chunk

    params = {
        "observations": STATE,
        "actions": {
            "arm": {"topic": "arm_cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"},
            "gripper": {"topic": "gripper_cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"},
        },
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    with ScriptedTrainer({"action_horizon": horizon, "action_dim": 1}, actions) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            first_diag(
                diagnostics,
                lambda m: "no subscriber on /arm_cmd, /gripper_cmd" in env_status(m, 0)[1],
                20,
                "the env waiting for subscribers of both actuators",
            )
            arm = robot.listen(Float64MultiArray, "/arm_cmd")  # one of two: still no chunk
            first_diag(
                diagnostics,
                lambda m: env_status(m, 0)[1].startswith("no subscriber on /gripper_cmd "),
                20,
                "the env waiting for the gripper's subscriber only",
            )
            wait_until(lambda: "no subscriber on /gripper_cmd: no chunk starts" in child.output(), 20,
                       "the warning naming the actuator nobody listens to")  # fmt: skip
            assert not trainer.messages("infer") and not arm
            gripper = robot.listen(Float64MultiArray, "/gripper_cmd")
            wait_until(lambda: len(arm) >= 3 * horizon and len(gripper) >= 3 * horizon, 20, "three chunks")
    expected = np.arange(3 * horizon, dtype=np.float64)
    for inbox in (arm, gripper):
        np.testing.assert_array_equal([m.data[0] for m in inbox.msgs()[: 3 * horizon]], expected)


# -- m. the timer mode's step rate -------------------------------------------------------------


@contextmanager
def fast_trainer(horizon: int, action_dim: int) -> Iterator[str]:
    """bench/bench_trainer.py in its own process (answers at once, no GIL shared with the test); its URI."""
    with process([sys.executable, str(ROOT / "bench" / "bench_trainer.py"), "--horizon", str(horizon),
                  "--action-dim", str(action_dim), "--reuse"]) as child:  # fmt: skip
        line = wait_until(
            lambda: next((x for x in child.output().splitlines() if x.startswith("PORT ")), None), 20, "the port"
        )
        yield f"ws://127.0.0.1:{int(line.split()[1])}"


@pytest.mark.parametrize("horizon", [1, 5])
def test_in_timer_mode_each_robot_steps_about_once_per_tick_even_with_one_step_chunks(tmp_path, robot, horizon):
    """A new chunk's first step goes out as it arrives: a step lasts one period, not two (one of them idle)."""
    envs = ["robot0", "robot1"]
    params = {
        "envs": envs,
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
    }
    for ns in envs:
        robot.stream(Float64MultiArray, f"/{ns}/state", float_state(1.0))
    cmds = [robot.listen(Float64MultiArray, f"/{ns}/cmd") for ns in envs]  # idle none: one message per step
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    window_s = 4.0
    with fast_trainer(horizon, 1) as uri, bridge(tmp_path, bridge_params(uri, **params)):
        wait_until(lambda: all(len(c) >= 25 for c in cmds), 30, "both robots stepping")
        t0 = time.monotonic()
        wait_until(lambda: time.monotonic() > t0 + window_s, window_s + 1, "the measurement window")
        t1 = time.monotonic()
        _, diag = first_diag(diagnostics, lambda m: True, 5, "/diagnostics after the window", since=t1)
    steps = [len([t for t, _ in c.timed(t0) if t <= t1]) for c in cmds]
    # Generous: the ideal is one step per tick; two ticks per step (the old timer rule) would be half
    # of it. Ticks, not rate_hz: a loaded machine may not keep the loop itself at 50 Hz.
    shown = statuses(diag)
    loop_hz = min(RATE_HZ, float(shown[f"{DIAG_PREFIX}: control"][2]["loop rate Hz"]))
    floor = 0.7 * loop_hz * window_s
    round_trip_ms = float(shown[f"{DIAG_PREFIX}: trainer"][2]["infer round trip median ms"])
    if min(steps) < floor and round_trip_ms > 750 * PERIOD_S:
        # An answer later than 3/4 of a period spans two ticks by design: nothing to measure here.
        pytest.skip(f"machine too loaded: median trainer round trip {round_trip_ms} ms; steps {steps}")
    assert min(steps) >= floor, f"steps per robot in {window_s:g} s: {steps}, expected at least {floor:g}; {shown}"
    for index in range(len(envs)):
        rate = float(env_status(diag, index)[2]["step rate Hz"])
        assert rate >= 0.7 * loop_hz, f"env {index}: /diagnostics shows {rate} env steps/s; {shown}"


# -- n. simulated time that never starts ---------------------------------------------------------


def test_with_use_sim_time_and_no_clock_the_log_and_diagnostics_say_they_wait_for_clock(tmp_path, robot):
    params = {
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1]}},
        "status": {"diagnostics_period_s": 0.2, "log_period_s": 0.5},
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    with bridge(tmp_path, bridge_params("ws://127.0.0.1:9", **params), "-p", "use_sim_time:=true") as child:
        _, diag = first_diag(diagnostics, lambda m: True, 20, "/diagnostics although no /clock comes")
        wait_until(lambda: "waiting for /clock" in child.output(), 20, "the log to say it waits for /clock")
        clock = SimClock(robot)
        clock.running = True
        _, after = first_diag(
            diagnostics,
            lambda m: "waiting for /clock" not in statuses(m)[f"{DIAG_PREFIX}: control"][1],
            20,
            "/diagnostics once /clock runs",
        )
    level, message, _ = statuses(diag)[f"{DIAG_PREFIX}: control"]
    assert level == WARN and "waiting for /clock" in message, message
    assert after.header.stamp.sec >= 1  # stamped in simulated time once it runs


# -- o. an action wider than the actuators read ----------------------------------------------------


def test_a_trainer_whose_action_does_not_fit_is_a_configuration_error_said_once_and_retried_slowly(tmp_path, robot):
    params = {
        "observations": STATE,
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 2], "idle": "none"}},
        # the first reconnect of a passing fault would come after 0.1 s; a mismatch waits reconnect_max_s
        "trainer": {"reconnect_initial_s": 0.1, "reconnect_max_s": 2.0},
        "status": {"diagnostics_period_s": 0.2},
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    cmd = robot.listen(Float64MultiArray, "/cmd")
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    with ScriptedTrainer({"action_horizon": 2, "action_dim": 6}) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            wait_until(lambda: trainer.connections >= 3, 30, "the bridge to refuse the metadata and reconnect twice")
            _, diag = first_diag(
                diagnostics, lambda m: statuses(m)[f"{DIAG_PREFIX}: trainer"][0] == 2, 10, "an ERROR trainer entry"
            )
            output = child.output()
            opened = list(trainer.opened)
    assert "metadata.data.action_dim: 6, but the configured actions read 2" in output
    assert "set control.action_dim: 6" in output
    assert output.count("does not fit this bridge's configuration") == 1, output  # said once, at ERROR
    assert "[ERROR]" in next(line for line in output.splitlines() if "does not fit this bridge's" in line)
    gaps = [b - a for a, b in itertools.pairwise(opened)]
    assert all(gap >= 1.9 for gap in gaps), gaps  # reconnect_max_s, not reconnect_initial_s
    _, message, _ = statuses(diag)[f"{DIAG_PREFIX}: trainer"]
    assert "action_dim: 6, but the configured actions read 2" in message
    assert not trainer.messages("infer") and len(cmd) == 0
