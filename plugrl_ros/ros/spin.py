"""Running a helper node until Ctrl-C: the init/spin/shutdown every small executable needs."""

from __future__ import annotations

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node


def spin_until_shutdown(node: Node) -> int:
    """Spin ``node`` until Ctrl-C or a ROS shutdown, then destroy it and shut ROS down; exit status 0."""
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0
