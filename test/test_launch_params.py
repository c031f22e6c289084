"""Opt-in, with a real ``ros2 launch``: inline launch-file parameters start the bridge; its parameters are read-only.

Skipped unless PLUGRL_ROS2_LAUNCH_ENV names a toolchain's env.sh (see launch_toolchain.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from launch_toolchain import Workspace, build_workspace

INLINE_LAUNCH = '''\
"""A user's launch file: the bridge's parameters inline, lists included."""

from launch_ros.actions import Node

from launch import LaunchDescription


def generate_launch_description():
    parameters = {
        "trainer": {"uri": "ws://127.0.0.1:9", "reconnect_max_s": 0.5},
        "envs": ["robot1", "robot2"],
        "control": {"rate_hz": 30.0},
        "observations": {
            "states": {"joints": {"topic": "joint_states", "type": "sensor_msgs/JointState", "joints": ["j1", "j2"]}}
        },
        "actions": {"arm": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 2], "max": [1.0, 1.0]}},
    }
    node = Node(
        package="plugrl_ros", executable="bridge", name="plugrl_bridge", output="screen", parameters=[parameters]
    )
    return LaunchDescription([node])
'''

PARAM = "--no-daemon --spin-time 2"  # no ros2 daemon left behind; discovery within the command


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Workspace:
    return build_workspace(tmp_path_factory.mktemp("ws"))


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


def ros2_param(workspace: Workspace, args: str) -> str:
    """``ros2 param <args>``'s output, asked again while discovery has not found the node yet."""

    def answer() -> str | None:
        out = workspace.run(f"ros2 param {args}").stdout
        return None if "Node not found" in out else out

    return wait_for(answer, 60, f"ros2 param {args}")


def started(log: Path, proc) -> bool:
    return "env(s)" in log.read_text() or proc.poll() is not None


def test_a_user_launch_file_with_inline_list_parameters_starts_the_bridge(workspace, tmp_path):
    launch_file = tmp_path / "inline.launch.py"
    launch_file.write_text(INLINE_LAUNCH)
    log = tmp_path / "launch.log"
    with workspace.launched(f"ros2 launch {launch_file}", log) as proc:
        wait_for(lambda: started(log, proc), 60, "the bridge starting")
        assert proc.poll() is None, log.read_text()
        assert "2 env(s): robot1, robot2; mode timer at 30 Hz" in log.read_text()
        assert "['robot1', 'robot2']" in ros2_param(workspace, f"get {PARAM} /plugrl_bridge envs")
        joints = ros2_param(workspace, f"get {PARAM} /plugrl_bridge observations.states.joints.joints")
        assert "['j1', 'j2']" in joints
        assert "[0, 2]" in ros2_param(workspace, f"get {PARAM} /plugrl_bridge actions.arm.slice")
    text = log.read_text()
    assert "process has finished cleanly" in text, text
    assert "Traceback" not in text, text


def test_ros2_param_set_of_a_read_only_parameter_is_refused(workspace, tmp_path):
    launch_file = tmp_path / "inline.launch.py"
    launch_file.write_text(INLINE_LAUNCH)
    log = tmp_path / "launch.log"
    with workspace.launched(f"ros2 launch {launch_file}", log) as proc:
        wait_for(lambda: started(log, proc), 60, "the bridge starting")
        assert proc.poll() is None, log.read_text()
        described = ros2_param(workspace, f"describe {PARAM} /plugrl_bridge control.rate_hz")
        assert "Read only: true" in described
        assert "Type: double" in described and "Max value: 2000.0" in described
        refused = ros2_param(workspace, f"set {PARAM} /plugrl_bridge control.rate_hz 50.0")
        assert "Setting parameter failed: Trying to set a read-only parameter: control.rate_hz" in refused
        assert "Double value is: 30.0" in ros2_param(workspace, f"get {PARAM} /plugrl_bridge control.rate_hz")
        listed = ros2_param(workspace, f"list {PARAM} /plugrl_bridge")
        assert "actions.arm.idle" in listed and "episode.max_steps" in listed  # defaults are declared too
        assert "mode timer at 30 Hz" in log.read_text()


def test_bridge_launch_reads_an_overlay_after_the_config(workspace, tmp_path):
    """``overlay:=`` is a second params file over ``config:=`` (config/demo_lerobot.yaml over config/demo.yaml)."""
    log = tmp_path / "launch.log"
    config = Path(__file__).resolve().parents[1] / "config"
    command = (
        f"ros2 launch plugrl_ros bridge.launch.py config:={config / 'demo.yaml'} "
        f"overlay:={config / 'demo_lerobot.yaml'} mode:=deploy policy_uri:=ws://127.0.0.1:9"
    )
    with workspace.launched(command, log) as proc:
        wait_for(lambda: started(log, proc), 60, "the bridge starting")
        assert proc.poll() is None, log.read_text()
        # the overlay's value wins over demo.yaml's 5; demo.yaml's states stay, the overlay's image joins them
        assert "Integer value is: 0" in ros2_param(workspace, f"get {PARAM} /plugrl_bridge policy.action_horizon")
        listed = ros2_param(workspace, f"list {PARAM} /plugrl_bridge")
        assert "policy.observations.image.camera" in listed and "policy.observations.state.joints" in listed
    bad = tmp_path / "bad.log"
    with workspace.launched(f"ros2 launch plugrl_ros bridge.launch.py overlay:={tmp_path / 'none.yaml'}", bad) as proc:
        wait_for(lambda: proc.poll() is not None, 60, "launch refusing the missing overlay")
    assert "overlay:=" in bad.read_text() and "no such params file" in bad.read_text()
