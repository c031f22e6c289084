"""ROS's own arguments on a command line: the ``--ros-args ... [--]`` blocks, found without rclpy.

One reading for every executable (the bridge's parameter checks, the robots', the
trainers' own arguments): a launch file passes ``--ros-args`` to every process it
starts, including those that never import rclpy.
"""

from __future__ import annotations

from collections.abc import Sequence

ROS_ARGS = "--ros-args"
END_OF_ROS_ARGS = "--"


def split_ros_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the program's own arguments, the arguments inside ``--ros-args ... [--]`` blocks), as rcl splits them."""
    own: list[str] = []
    ros: list[str] = []
    inside = False
    for arg in argv:
        if arg == ROS_ARGS:
            inside = True
        elif inside and arg == END_OF_ROS_ARGS:
            inside = False
        else:
            (ros if inside else own).append(arg)
    return own, ros


def without_ros_args(argv: Sequence[str]) -> list[str]:
    """``argv`` without its ``--ros-args`` blocks."""
    return split_ros_args(argv)[0]
