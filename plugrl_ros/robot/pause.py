"""Whether the robots may move: the pause topic (latching, or a dead-man switch) and ``~/set_paused``.

Either source pauses; both must allow running. A change is reported to the
robot side through ``on_change(source)``, which idles the actuators and tells
the mode (the PlugRL rollout truncates running episodes).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rclpy.node import Node
from std_msgs.msg import Bool
from std_srvs.srv import SetBool

from plugrl_ros.robot.dead_man import DeadManSwitch
from plugrl_ros.ros.config import PauseConfig
from plugrl_ros.ros.qos import qos_profile


class Pause:
    """The node's pause state; :meth:`check` must run on every control tick (the dead-man's silence)."""

    def __init__(
        self, node: Node, config: PauseConfig, callback_group: object, on_change: Callable[[str], None]
    ) -> None:
        self._config = config
        self._on_change = on_change
        self._dead_man = DeadManSwitch(config.max_age_s, time.monotonic) if config.max_age_s > 0 else None
        self._by_topic = self._dead_man is not None  # stopped until the switch first says run
        self._by_service = config.start_paused
        if config.topic:
            # A latching pause must not lose a message; a dead-man switch wants only its latest
            # (a backlog of old "run" messages must not count as fresh), from any publisher.
            qos = qos_profile("reliable", 10) if self._dead_man is None else qos_profile("sensor_data", 1)
            node.create_subscription(Bool, config.topic, self._on_topic, qos, callback_group=callback_group)
        node.create_service(SetBool, "~/set_paused", self._on_set_paused, callback_group=callback_group)

    @property
    def paused(self) -> bool:
        return self._by_topic or self._by_service

    @property
    def dead_man(self) -> bool:
        return self._dead_man is not None

    @property
    def by_service(self) -> bool:
        return self._by_service

    def check(self) -> None:
        """A dead-man switch silent for longer than ``pause.max_age_s`` pauses the robots."""
        if self._dead_man is not None:
            self._dead_man_changed(self._dead_man.expired())

    def _on_topic(self, msg: Bool) -> None:
        if self._dead_man is not None:
            self._dead_man_changed(self._dead_man.heard(pause=msg.data))
        elif msg.data != self._by_topic:
            self._by_topic = msg.data
            self._on_change(f"pause topic {self._config.topic}")

    def _dead_man_changed(self, change: str | None) -> None:
        if change is not None and self._dead_man is not None:
            self._by_topic = self._dead_man.stopping
            self._on_change(f"the dead-man switch on {self._config.topic} ({change})")

    def _on_set_paused(self, request: SetBool.Request, response: SetBool.Response) -> SetBool.Response:
        self._by_service = request.data
        self._on_change("~/set_paused")
        response.success = True
        response.message = "paused" if self.paused else "running"
        return response
