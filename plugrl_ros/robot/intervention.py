"""One env's person in the loop: their device's topics, the takeover rule, and their command as an action row.

The person's command arrives either as a ``sensor_msgs/Joy`` (each action
value one axis, scaled and offset) or, per actuator, on a topic of the
actuator's own message type (a teleop node's Twist, a leader arm's
JointState), mapped back through the actuator's scale and offset. Either way
it becomes an action like the policy's, which the sinks then shape with the
same limits. The callbacks only store; the control tick asks :meth:`control`
and :meth:`command`. Who commands is :mod:`plugrl_ros.robot.takeover`'s rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from rclpy.node import Node
from sensor_msgs.msg import Joy
from std_msgs.msg import Bool

from plugrl_ros.robot.takeover import Control, Takeover
from plugrl_ros.ros.config import ActionConfig, InterventionConfig, env_topic
from plugrl_ros.ros.qos import qos_profile
from plugrl_ros.ros.sinks import ActionShaper
from plugrl_ros.ros.sources import ConversionError


class PersonInput:
    """The person's device for env ``index``: :meth:`control` says who commands, :meth:`command` what they say."""

    def __init__(
        self,
        node: Node,
        index: int,
        namespace: str,
        config: InterventionConfig,
        actions: tuple[ActionConfig, ...],
        callback_group: object,
        clock_s: Callable[[], float],
    ) -> None:
        self.index = index
        self.namespace = namespace
        self._node = node
        self._config = config
        self._clock_s = clock_s
        self.takeover = Takeover(config.takeover, config.max_age_s, clock_s)
        self.width = max(a.stop or 0 for a in actions)
        self._command: np.ndarray | None = None  # the person's latest whole command, in action space
        self.problem = ""  # why the person's last message gave no command, until one does
        self.topics: list[str] = []
        qos = qos_profile(config.qos, 1)  # only the latest: a backlog of old commands must not count as fresh
        if config.joy_topic:
            self._subscribe(Joy, config.joy_topic, self._on_joy, qos, callback_group)
            self._axes = np.array(config.axes, dtype=np.intp)
            self._scale = np.array(config.scale, dtype=np.float64)
            self._offset = np.array(config.offset, dtype=np.float64)
        if config.topic:
            self._subscribe(Bool, config.topic, self._on_deadman, qos, callback_group)
        self._parts: list[tuple[ActionConfig, ActionShaper]] = []
        self._part_values: list[np.ndarray | None] = []
        self._part_s: list[float] = []
        if config.source == "actions":
            for k, (action, topic) in enumerate(zip(actions, config.action_topics, strict=True)):
                self._parts.append((action, action.make_shaper()))
                self._part_values.append(None)
                self._part_s.append(-np.inf)
                self._subscribe(action.sink.msg_type, topic, self._part_callback(k), qos, callback_group)

    def _subscribe(self, msg_type: type, topic: str, callback: Any, qos: Any, group: object) -> None:
        resolved = env_topic(self.namespace, topic)
        self._node.create_subscription(msg_type, resolved, callback, qos, callback_group=group)
        self.topics.append(resolved)

    def control(self) -> Control:
        """Who commands the robot now (see :class:`plugrl_ros.robot.takeover.Takeover`)."""
        return self.takeover.control()

    def command(self) -> np.ndarray | None:
        """The person's latest command, an action row ``[width]`` (None: none yet)."""
        return self._command

    # -- the device ----------------------------------------------------------

    def _refused(self, why: str) -> None:
        self.problem = why
        self._node.get_logger().error(f"env {self.index}: the person's command: {why}", throttle_duration_sec=10.0)

    def _on_joy(self, msg: Joy) -> None:
        config = self._config
        if config.takeover == "button":
            if config.button >= len(msg.buttons):
                # not heard as the deadman: if it was held, its silence makes the robot idle
                self._refused(
                    f"the Joy on {config.joy_topic} has {len(msg.buttons)} buttons; intervention.joy.button is "
                    f"{config.button}"
                )
                return
            self.takeover.deadman(bool(msg.buttons[config.button]))
        if config.source != "joy":
            return
        axes = np.asarray(msg.axes, dtype=np.float64)
        if len(axes) <= int(self._axes.max()):
            self._refused(
                f"the Joy on {config.joy_topic} has {len(axes)} axes; intervention.joy.axes reads {list(config.axes)}"
            )
            return
        command = axes[self._axes] * self._scale + self._offset
        if not np.isfinite(command).all():
            self._refused(f"the Joy on {config.joy_topic} gave non-finite values {command.tolist()}")
            return
        self._command = command
        self.problem = ""
        self.takeover.commanded()

    def _on_deadman(self, msg: Bool) -> None:
        self.takeover.deadman(bool(msg.data))

    def _part_callback(self, k: int) -> Callable[[Any], None]:
        def callback(msg: Any) -> None:
            action, shaper = self._parts[k]
            try:
                values = action.sink.read(msg)
            except ConversionError as exc:
                self._refused(f"{self._config.action_topics[k]}: {exc}")
                return
            part = shaper.unshape(values)
            if part.shape != (action.stop - action.start,) or not np.isfinite(part).all():
                self._refused(f"{self._config.action_topics[k]}: not {action.stop - action.start} finite values")
                return
            now = self._clock_s()
            self._part_values[k] = part
            self._part_s[k] = now
            # the command is whole, and fresh, only while every actuator's part keeps coming
            if all(now - t <= self._config.max_age_s for t in self._part_s):
                command = np.zeros(self.width, dtype=np.float64)
                for (config, _), values_k in zip(self._parts, self._part_values, strict=True):
                    command[config.start : config.stop] = values_k
                self._command = command
                self.problem = ""
                self.takeover.commanded()

        return callback
