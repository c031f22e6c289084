"""The one reading of ``--ros-args`` blocks that every executable uses (rclpy-free: trainers have no rclpy)."""

from __future__ import annotations

from plugrl_ros.ros_args import split_ros_args, without_ros_args


def test_each_ros_args_block_ends_at_a_double_dash_or_the_end_and_the_rest_is_the_programs():
    argv = ["prog", "--port", "1", "--ros-args", "-r", "__node:=x", "--", "--envs", "2", "--ros-args", "-p", "a:=1"]
    assert split_ros_args(argv) == (["prog", "--port", "1", "--envs", "2"], ["-r", "__node:=x", "-p", "a:=1"])


def test_a_command_line_without_ros_args_is_left_as_it_is_and_a_double_dash_outside_a_block_stays():
    assert without_ros_args(["prog", "--", "x"]) == ["prog", "--", "x"]
    assert without_ros_args([]) == []
