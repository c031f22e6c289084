"""Action sinks: one env's action slice, shaped to the robot's limits, out as one actuator message."""

from __future__ import annotations

import array
from typing import Any, Protocol

import numpy as np
from builtin_interfaces.msg import Duration, Time
from geometry_msgs.msg import Twist, TwistStamped
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64, Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from plugrl_ros.params.section import ConfigError, Section
from plugrl_ros.ros.field_paths import (
    compile_path,
    fields_of,
    has_interface_kind,
    interface_class,
    message_factory,
)
from plugrl_ros.ros.sources import ConversionError, read_joint_names, read_slice, require_fields, short_type_name

IDLE_CHOICES = ("hold", "zero", "none")


class Sink(Protocol):
    """Builds one actuator message from ``width`` shaped action values (None: as many as the action has).

    :meth:`read` is the way back: the values a message of the sink's own type commands (a person's
    command on a teleop topic, for interventions); ConversionError if it does not hold them.
    """

    msg_type: type
    width: int | None

    def build(self, values: np.ndarray, stamp: Time) -> Any: ...

    def read(self, msg: Any) -> np.ndarray: ...


def _named(names: Any, values: Any, joints: tuple[str, ...], what: str) -> np.ndarray:
    """``values`` of the ``joints``, found by name in ``names`` (a person's command names its joints)."""
    where = {name: i for i, name in enumerate(names)}
    missing = [j for j in joints if j not in where]
    if missing:
        raise ConversionError(f"joint '{missing[0]}' is not in the {what} (has: {', '.join(names) or 'no joints'})")
    data = np.asarray(values, dtype=np.float64)
    if len(data) < len(where):
        raise ConversionError(f"the {what} has {len(data)} values for {len(where)} joint names")
    return data[[where[j] for j in joints]]


def _doubles(values: np.ndarray) -> array.array:
    # An array.array('d') is taken by the message setters as is, on every
    # ROS distro, instead of being checked and copied element by element.
    return array.array("d", np.ascontiguousarray(values, dtype=np.float64).tobytes())


def duration(seconds: float) -> Duration:
    """A builtin_interfaces Duration of ``seconds`` (>= 0), rounded to the nanosecond."""
    total_ns = round(seconds * 1e9)
    return Duration(sec=total_ns // 1_000_000_000, nanosec=total_ns % 1_000_000_000)


class Float64MultiArraySink:
    """std_msgs/Float64MultiArray: data = values; the width comes from ``slice``.

    Without a slice the sink takes the whole action, as wide as the trainer sends it (a simulator or a
    generic controller that reads one vector): then it must be the bridge's only actuator.
    """

    msg_type = Float64MultiArray

    def __init__(self, section: Section, period_s: float) -> None:
        del period_s
        span = read_slice(section, required=False)
        self.width: int | None = None if span is None else span[1] - span[0]

    def build(self, values: np.ndarray, stamp: Time) -> Float64MultiArray:
        del stamp  # the message has no header
        msg = Float64MultiArray()
        msg.data = _doubles(values)
        return msg

    def read(self, msg: Float64MultiArray) -> np.ndarray:
        data = np.asarray(msg.data, dtype=np.float64)[msg.layout.data_offset :]
        if self.width is not None and len(data) != self.width:
            raise ConversionError(f"the array has {len(data)} values; this actuator takes {self.width}")
        return data.copy()


class JointStateSink:
    """sensor_msgs/JointState: one of position/velocity/effort for the configured joints."""

    msg_type = JointState

    def __init__(self, section: Section, period_s: float) -> None:
        del period_s
        self.joints = read_joint_names(section)
        self.field = section.str("field", "position", choices=("position", "velocity", "effort"))
        self.width = len(self.joints)

    def build(self, values: np.ndarray, stamp: Time) -> JointState:
        msg = JointState()
        msg.header.stamp = stamp
        msg.name = list(self.joints)
        setattr(msg, self.field, _doubles(values))
        return msg

    def read(self, msg: JointState) -> np.ndarray:
        return _named(msg.name, getattr(msg, self.field), self.joints, f"JointState's {self.field}")


class JointTrajectorySink:
    """trajectory_msgs/JointTrajectory: one point, reached one control period from now."""

    msg_type = JointTrajectory

    def __init__(self, section: Section, period_s: float) -> None:
        assert period_s > 0, period_s
        self.joints = read_joint_names(section)
        self.field = section.str("field", "positions", choices=("positions", "velocities", "effort"))
        self.width = len(self.joints)
        # The controller interpolates to the point over one control period, so
        # the motion is smooth and done when the next action arrives.
        self.time_from_start = duration(period_s)

    def build(self, values: np.ndarray, stamp: Time) -> JointTrajectory:
        point = JointTrajectoryPoint()
        setattr(point, self.field, _doubles(values))
        point.time_from_start = Duration(sec=self.time_from_start.sec, nanosec=self.time_from_start.nanosec)
        msg = JointTrajectory()
        msg.header.stamp = stamp
        msg.joint_names = list(self.joints)
        msg.points = [point]
        return msg

    def read(self, msg: JointTrajectory) -> np.ndarray:
        """The first point: what the controller is sent to reach next."""
        if not msg.points:
            raise ConversionError("the JointTrajectory has no point")
        return _named(msg.joint_names, getattr(msg.points[0], self.field), self.joints, f"trajectory's {self.field}")


TWIST_FIELDS = ("linear.x", "linear.y", "linear.z", "angular.x", "angular.y", "angular.z")


class TwistSink:
    """geometry_msgs/Twist: the listed ``fields`` (one per action value); the others are 0."""

    msg_type = Twist

    def __init__(self, section: Section, period_s: float) -> None:
        del period_s
        fields = section.str_list("fields", nonempty=True)
        for field in fields:
            if field not in TWIST_FIELDS:
                raise ConfigError(
                    section.key("fields"), fields, f"each entry must be one of: {', '.join(TWIST_FIELDS)}"
                )
        if len(set(fields)) != len(fields):
            raise ConfigError(section.key("fields"), fields, "each field may be listed once")
        self.fields = tuple(tuple(f.split(".")) for f in fields)
        self.width = len(fields)

    def _fill(self, twist: Twist, values: np.ndarray) -> None:
        for (part, axis), value in zip(self.fields, values.tolist(), strict=True):
            setattr(getattr(twist, part), axis, value)

    def _values(self, twist: Twist) -> np.ndarray:
        return np.array([getattr(getattr(twist, part), axis) for part, axis in self.fields], dtype=np.float64)

    def read(self, msg: Twist) -> np.ndarray:
        return self._values(msg)

    def build(self, values: np.ndarray, stamp: Time) -> Twist:
        del stamp  # the message has no header
        msg = Twist()
        self._fill(msg, values)
        return msg


class TwistStampedSink(TwistSink):
    """geometry_msgs/TwistStamped: as Twist, with ``frame_id`` and the stamp in the header."""

    msg_type = TwistStamped

    def __init__(self, section: Section, period_s: float) -> None:
        super().__init__(section, period_s)
        self.frame_id = section.str("frame_id")

    def build(self, values: np.ndarray, stamp: Time) -> TwistStamped:
        msg = TwistStamped()
        msg.header.stamp = stamp
        msg.header.frame_id = self.frame_id
        self._fill(msg.twist, values)
        return msg

    def read(self, msg: Any) -> np.ndarray:  # a TwistStamped
        return self._values(msg.twist)


class Float64Sink:
    """std_msgs/Float64: one value."""

    msg_type = Float64
    width = 1

    def __init__(self, section: Section, period_s: float) -> None:
        del section, period_s  # no keys of its own

    def build(self, values: np.ndarray, stamp: Time) -> Float64:
        del stamp  # the message has no header
        return Float64(data=float(values[0]))

    def read(self, msg: Float64) -> np.ndarray:
        return np.array([msg.data], dtype=np.float64)


SINKS: dict[str, type] = {
    "std_msgs/Float64MultiArray": Float64MultiArraySink,
    "sensor_msgs/JointState": JointStateSink,
    "trajectory_msgs/JointTrajectory": JointTrajectorySink,
    "geometry_msgs/Twist": TwistSink,
    "geometry_msgs/TwistStamped": TwistStampedSink,
    "std_msgs/Float64": Float64Sink,
}


class FieldsSink:
    """Any message type: the action's values go where the ``fields`` paths say, in order; every other field
    keeps its value from ``defaults`` (nested like the message), else the type's own default.

    The typed sinks above are the fast paths of their types; this covers every other installed type by
    its own introspection (plugrl_ros.ros.field_paths). A ``header`` (std_msgs/Header) gets the stamp.
    """

    def __init__(self, msg_type: type, section: Section, period_s: float) -> None:
        del period_s
        self.msg_type = msg_type
        require_fields(msg_type, section, SINKS)
        defaults = section.tree("defaults")
        self._make = message_factory(msg_type, defaults, section.key("defaults"))
        paths = section.str_list("fields", nonempty=True)
        self._paths = [compile_path(msg_type, path, section.key("fields"), defaults) for path in paths]
        self.fields = tuple(paths)
        self.width: int | None = sum(p.width for p in self._paths)
        header = fields_of(msg_type).get("header")
        self._stamped = header is not None and getattr(header, "namespaces", None) == ["std_msgs", "msg"]

    def build(self, values: np.ndarray, stamp: Time) -> Any:
        msg = self._make()
        if self._stamped:
            msg.header.stamp = stamp
        at = 0
        for path in self._paths:
            path.write(msg, values[at : at + path.width])
            at += path.width
        return msg

    def read(self, msg: Any) -> np.ndarray:
        return np.concatenate([path.read(msg) for path in self._paths])


class GoalSink(FieldsSink):
    """An action server's goal (``pkg/action/Type``): filled by field paths like :class:`FieldsSink`.

    What makes it a goal is on the robot side (plugrl_ros.robot.goal_actuator): ``topic`` names the
    action server, ``running_goal`` says what a step does while the previous goal still runs (replace it,
    or skip the step), and ``goal_period_s`` is the least time between two goals (a gripper does not take
    50 goals a second; the steps in between send nothing).
    """

    def __init__(self, action_type: type, section: Section, period_s: float) -> None:
        super().__init__(action_type.Goal, section, period_s)
        self.action_type = action_type
        self.running_goal = section.str("running_goal")
        self.goal_period_s = section.float("goal_period_s")
        self.period_s = period_s  # the control period: steps come on its ticks


def make_sink(type_name: str, section: Section, period_s: float) -> Sink:
    """The sink for ``type_name``, configured from ``section``; ``period_s`` is the control period.

    A type with a typed sink (the registry) gets it; an action type (``pkg/action/Type``) becomes goals
    (:class:`GoalSink`); any other installed message type is filled by field paths (:class:`FieldsSink`).
    """
    if has_interface_kind(type_name, "action"):
        return GoalSink(interface_class(type_name, "action", section.key("type")), section, period_s)
    cls = SINKS.get(short_type_name(type_name))
    if cls is not None:
        return cls(section, period_s)
    return FieldsSink(interface_class(type_name, "msg", section.key("type")), section, period_s)


def _optional_list(section: Section, name: str, width: int) -> np.ndarray | None:
    if not section.has(name):
        return None
    return np.array(section.float_list(name, length=width), dtype=np.float64)


class ActionShaper:
    """Turns the env's action vector into the values one sink publishes, within the configured limits.

    Order: slice -> value * scale + offset -> clip to [min, max] -> at most
    ``max_delta`` away from the last published values -> clip again. A slice
    with any non-finite value (or one that overflows when scaled) yields None
    and nothing is published: clipping +inf to ``max`` would drive the robot
    to its limit on a broken action.
    """

    def __init__(
        self,
        *,
        start: int,
        stop: int | None,
        scale: np.ndarray,
        offset: np.ndarray,
        low: np.ndarray | None,
        high: np.ndarray | None,
        max_delta: np.ndarray | None,
        idle: str,
    ) -> None:
        assert idle in IDLE_CHOICES, idle
        self.start = start
        self.stop = stop  # None: the whole action, as wide as the trainer sends it
        self.width = None if stop is None else stop - start
        self.scale = scale
        self.offset = offset
        self.low = low
        self.high = high
        self.max_delta = max_delta
        self.idle = idle
        self._last: np.ndarray | None = None

    @classmethod
    def from_section(cls, section: Section, width: int | None) -> ActionShaper:
        """Reads slice, scale, offset, min, max, max_delta and idle; ``width`` is the sink's (None: whole action)."""
        if width is None:
            return cls._whole_action(section)
        start, stop = read_slice(section, required=False) or (0, width)
        if stop - start != width:
            raise ConfigError(
                section.key("slice"),
                [start, stop],
                f"stop - start must be {width}, the number of values this sink takes",
            )
        scale = np.array(section.float_list("scale", length=width), dtype=np.float64)
        offset = np.array(section.float_list("offset", length=width), dtype=np.float64)
        low = _optional_list(section, "min", width)
        high = _optional_list(section, "max", width)
        if low is not None and high is not None and np.any(low > high):
            i = int(np.argmax(low > high))
            raise ConfigError(
                section.key("min"), low.tolist(), f"min must not exceed max (element {i}: min {low[i]} > max {high[i]})"
            )
        max_delta = _optional_list(section, "max_delta", width)
        if max_delta is not None and np.any(max_delta <= 0):
            raise ConfigError(section.key("max_delta"), max_delta.tolist(), "every value must be greater than 0")
        idle = section.str("idle")
        return cls(
            start=start, stop=stop, scale=scale, offset=offset, low=low, high=high, max_delta=max_delta, idle=idle
        )

    @classmethod
    def _whole_action(cls, section: Section) -> ActionShaper:
        """A sink without a slice: the whole action. Its width is the trainer's to say, so limits that need one
        value per element cannot be checked at startup: they are refused, naming the key."""
        for name in ("min", "max", "max_delta"):
            if section.has(name):
                raise ConfigError(
                    section.key(name),
                    section.values().get(name),
                    "per-element limits need a slice: without one this actuator takes the whole action, as wide "
                    "as the trainer sends it (give slice: [start, stop])",
                )
        factors = []
        for name in ("scale", "offset"):
            try:
                factors.append(np.array(section.float_list(name, length=1), dtype=np.float64))
            except ConfigError:
                raise ConfigError(
                    section.key(name),
                    section.values().get(name),
                    "one number (applied to every element): without a slice the action's width is not known",
                ) from None
        idle = section.str("idle")
        return cls(
            start=0, stop=None, scale=factors[0], offset=factors[1], low=None, high=None, max_delta=None, idle=idle
        )

    def shape(self, action: np.ndarray) -> np.ndarray | None:
        """The values to publish for this env's ``action`` (float64 [A]), or None if they are not finite."""
        if self.stop is not None and action.shape[0] < self.stop:
            # The bridge checks the trainer's action space against every slice
            # at startup, so this is a programming error, not a user's.
            raise ValueError(f"the action has {action.shape[0]} values; this sink reads [{self.start}, {self.stop})")
        # Overflow to inf (and inf * 0 = nan) is caught just below; numpy need not warn about it.
        with np.errstate(over="ignore", invalid="ignore"):
            values = action[self.start : self.stop].astype(np.float64) * self.scale + self.offset
        if not np.isfinite(values).all():
            return None
        if self.low is not None or self.high is not None:
            np.clip(values, self.low, self.high, out=values)
        if self.max_delta is not None and self._last is not None:
            np.clip(values, self._last - self.max_delta, self._last + self.max_delta, out=values)
            if self.low is not None or self.high is not None:
                # The limits win over the rate limit: after an idle "zero"
                # outside [min, max], the first step goes straight inside.
                np.clip(values, self.low, self.high, out=values)
        return values

    def unshape(self, values: np.ndarray) -> np.ndarray:
        """The action slice that commands ``values`` (the inverse of scale and offset; limits are not undone).

        A person's command given in the actuator's own units becomes an action like the policy's, and what
        an actuator was sent becomes the action it executed. Needs every scale non-zero (checked at startup
        where it is used).
        """
        return (np.asarray(values, dtype=np.float64) - self.offset) / self.scale

    @property
    def last(self) -> np.ndarray | None:
        """What was last published (None: nothing yet)."""
        return self._last

    def idle_values(self) -> np.ndarray | None:
        """What to publish while no action is available: the last values, zeros, or nothing (None)."""
        if self.idle == "hold":
            return None if self._last is None else self._last.copy()
        if self.idle == "zero":
            if self.width is None:  # the whole action: as wide as the last one published, if any was
                return None if self._last is None else np.zeros_like(self._last)
            return np.zeros(self.width, dtype=np.float64)
        return None

    def published(self, values: np.ndarray) -> None:
        """Record what was actually published: ``hold`` repeats it and ``max_delta`` counts from it."""
        assert self.width is None or values.shape == (self.width,), values.shape
        self._last = np.array(values, dtype=np.float64)
