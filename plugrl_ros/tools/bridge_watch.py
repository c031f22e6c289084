"""A small ROS node in a tool's process that follows a bridge's /diagnostics (the demo's progress, the probe)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

# One /diagnostics message: its statuses (name -> (message, values)) and when it arrived (time.monotonic()).
Statuses = dict[str, tuple[str, dict[str, str]]]


class BridgeWatch:
    """Calls ``on_statuses(statuses, received_at)`` for every /diagnostics message, on its own spin thread.

    The node has its own rclpy context and installs no signal handlers: Ctrl-C is the tool's to handle
    (:mod:`plugrl_ros.stop_request`), and the tool stops its children itself.
    """

    def __init__(self, node_name: str, on_statuses: Callable[[Statuses, float], None]) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.signals import SignalHandlerOptions

        self._on_statuses = on_statuses
        self._closed = False
        self._context = rclpy.Context()
        rclpy.init(context=self._context, signal_handler_options=SignalHandlerOptions.NO)
        self._node = rclpy.create_node(node_name, context=self._context)
        self._node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self._executor = SingleThreadedExecutor(context=self._context)
        self._executor.add_node(self._node)
        self._thread = threading.Thread(target=self._spin, name=f"{node_name}-spin", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException

        try:
            self._executor.spin()
        except ExternalShutdownException:
            pass

    def _on_diagnostics(self, msg: Any) -> None:
        statuses = {s.name: (s.message, {kv.key: kv.value for kv in s.values}) for s in msg.status}
        self._on_statuses(statuses, time.monotonic())

    def close(self) -> None:
        """Stop following (again is harmless)."""
        import rclpy

        if self._closed:
            return
        self._closed = True
        # the spin thread must have left rcl before its node and context go: a thread still waiting in rcl
        # when they are destroyed ends the process (std::terminate)
        self._executor.shutdown(timeout_sec=1.0)
        self._thread.join(5.0)
        self._node.destroy_node()
        rclpy.try_shutdown(context=self._context)
