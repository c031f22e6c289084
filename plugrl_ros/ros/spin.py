"""Running a helper node until Ctrl-C: the init/spin/shutdown every small executable needs."""

from __future__ import annotations

import rclpy
from rclpy.executors import Executor, ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from plugrl_ros import stop_request

# How long one executor turn may wait: a stop request is seen within it (the
# signal handler runs only once the wait returns).
_TURN_S = 0.1


def init_ros(args: list[str] | None) -> None:
    """``rclpy.init`` for an executable: SIGINT/SIGTERM only request a stop (see stop_request)."""
    stop_request.install()
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)


def spin_until_shutdown(node: Node, executor: Executor | None = None) -> int:
    """Spin ``node`` (on ``executor``, default a SingleThreadedExecutor) until Ctrl-C/SIGTERM or a ROS
    shutdown, then destroy it and shut ROS down; exit status 0."""
    executor = executor or SingleThreadedExecutor()
    executor.add_node(node)
    try:
        while not stop_request.requested() and rclpy.ok():
            executor.spin_once(timeout_sec=_TURN_S)
    except ExternalShutdownException:
        pass
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0
