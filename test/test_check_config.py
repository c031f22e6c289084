"""``plugrl-bridge --check-config``: params files resolved against the installed interfaces, nothing started."""

from __future__ import annotations

import subprocess

import pytest
from harness import python_module, ros_env, write_params

pytestmark = [pytest.mark.ros]

CONFIG = {
    "envs": ["robot1", "robot2"],
    "observations": {
        "states": {
            "tactile": {
                "topic": "tactile",
                "type": "test_msgs/msg/UnboundedSequences",
                "fields": ["float64_values[1:3]", "basic_types_values[0:2].int32_value"],
            },
            "scan": {"topic": "scan", "type": "sensor_msgs/LaserScan", "beams": 30},
        }
    },
    "actions": {
        "tool": {"topic": "tool", "type": "test_msgs/Nested", "fields": ["basic_types_value.float64_value"]},
        "grip": {"topic": "grip", "type": "test_msgs/action/Fibonacci", "fields": ["order"], "slice": [1, 2]},
    },
    "reset": {"mode": "service", "service_type": "test_msgs/srv/BasicTypes", "request": {"int32_value": 4}},
}


def check(*paths) -> subprocess.CompletedProcess:
    command = python_module("plugrl_ros.node.bridge_main", "--check-config", *map(str, paths))
    return subprocess.run(command, env=ros_env(), capture_output=True, text=True, timeout=60, check=False)


def test_a_config_that_resolves_prints_each_envs_observation_and_action_layout_and_exits_0(tmp_path):
    done = check(write_params(tmp_path / "robot.yaml", CONFIG))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "OK (mode train, control timer at 20 Hz, 2 env(s))" in out
    for env in ("robot1", "robot2"):
        block = out.split(f"({env}):", 1)[1]
        assert "states.tactile: float64[4]" in block and "states.scan: float64[30]" in block
        assert f"{env}/tactile (test_msgs/msg/UnboundedSequences): float64_values[1:3]" in block
        assert f"{env}/scan (sensor_msgs/LaserScan): 30 beams (min)" in block
        assert "action: 2 value(s) per step" in block
        assert f"[0, 1) actions.tool: published on {env}/tool (test_msgs/Nested)" in block
        assert f"[1, 2) actions.grip: goals to action server {env}/grip (test_msgs/action/Fibonacci): order" in block


def test_files_are_read_in_params_file_order_and_a_path_that_does_not_resolve_exits_2_naming_it(tmp_path):
    good = write_params(tmp_path / "good.yaml", CONFIG)
    bad = write_params(tmp_path / "bad.yaml", {"observations": {"states": {"scan": {"topic": "scan", "beams": 0}}}})
    bad_path = write_params(
        tmp_path / "path.yaml", {"actions": {"tool": {"fields": ["basic_types_value.float_value"]}}}
    )
    done = check(good, bad_path)  # the later file wins: its path is checked
    assert done.returncode == 2, done.stdout
    assert "actions.tool.fields: got 'basic_types_value.float_value'" in done.stderr
    assert "'basic_types_value' (test_msgs/msg/BasicTypes) has no field 'float_value'" in done.stderr
    assert not done.stdout
    done = check(bad_path, good)  # the good file's value wins
    assert done.returncode == 0, done.stderr
    done = check(good, bad)
    assert done.returncode == 2 and "observations.states.scan.beams: got 0; must be greater than 0" in done.stderr


def test_a_type_that_is_not_installed_or_no_file_exits_2_saying_why(tmp_path):
    config = {**CONFIG, "actions": {"tool": {"topic": "tool", "type": "my_robot_msgs/Tool", "fields": ["x"]}}}
    done = check(write_params(tmp_path / "robot.yaml", config))
    assert done.returncode == 2
    assert "actions.tool.type: got 'my_robot_msgs/Tool'; no installed ROS package 'my_robot_msgs'" in done.stderr
    done = check()
    assert done.returncode == 2 and "give the params files" in done.stderr
