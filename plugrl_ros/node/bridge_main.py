"""The bridge's executable (``ros2 run plugrl_ros bridge``): Ctrl-C is safe from its first moment.

This module imports nothing heavy: the stop handlers are in place before
rclpy and the bridge are imported (see :mod:`plugrl_ros.executables`).
"""

from __future__ import annotations

import sys

from plugrl_ros.executables import start


def main(args: list[str] | None = None) -> int:
    """``ros2 run plugrl_ros bridge --ros-args --params-file bridge.yaml``."""
    return start("plugrl_ros.node.process", args)


if __name__ == "__main__":
    sys.exit(main())
