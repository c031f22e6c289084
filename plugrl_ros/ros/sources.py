"""State and text sources: one ROS message in, one env's observation row (float64) or text out."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
from geometry_msgs.msg import PoseStamped, TwistStamped, WrenchStamped
from nav_msgs.msg import Odometry
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import Imu, JointState, LaserScan
from std_msgs.msg import Float32, Float32MultiArray, Float64, Float64MultiArray, String

from plugrl_ros.params.section import MISSING, ConfigError, Section
from plugrl_ros.ros.cdr import JointStateView, parse_joint_state
from plugrl_ros.ros.conversion import ConversionError, ShortMessage
from plugrl_ros.ros.field_paths import compile_path, describe_fields, interface_class, type_label

# A robot whose driver reorders joints on every message would otherwise grow
# the name->index cache without bound; a handful of orders is the real case.
_MAX_CACHED_JOINT_ORDERS = 16


class StateSource(Protocol):
    """Turns one message into one env's state row."""

    msg_type: type
    width: int | None
    raw: bool  # subscribed serialized: convert() takes the CDR bytes (and typed messages too)

    def convert(self, msg: Any) -> np.ndarray: ...


def ros_type_name(msg_type: type) -> str:
    """The "pkg/Type" name of a message class, as users write it in the config."""
    return f"{msg_type.__module__.split('.')[0]}/{msg_type.__name__}"


def short_type_name(type_name: str, kind: str = "msg") -> str:
    """ "pkg/msg/Type" (what ``ros2 topic`` prints) as "pkg/Type"; ``kind`` is "msg" or "srv"."""
    parts = type_name.split("/")
    if len(parts) == 3 and parts[1] == kind:
        return f"{parts[0]}/{parts[2]}"
    return type_name


def registered(registry: Mapping[str, type], type_name: str, section: Section) -> type:
    """The class registered for ``type_name``, written "pkg/Type" or "pkg/msg/Type"."""
    type_name = short_type_name(type_name)
    cls = registry.get(type_name)
    if cls is None:
        raise ConfigError(section.key("type"), type_name, f"allowed: {', '.join(sorted(registry))}")
    return cls


def read_slice(section: Section, required: bool) -> tuple[int, int] | None:
    """The optional ``slice: [start, stop]`` key, checked to be a non-empty range of indices."""
    if not required and not section.has("slice"):
        return None
    start, stop = section.int_list("slice", length=2)
    if not 0 <= start < stop:
        raise ConfigError(section.key("slice"), [start, stop], "expected [start, stop] with 0 <= start < stop")
    return start, stop


def read_joint_names(section: Section) -> tuple[str, ...]:
    """The required ``joints`` key: a non-empty list of distinct joint names."""
    joints = section.str_list("joints", nonempty=True)
    repeated = sorted({j for j in joints if joints.count(j) > 1})
    if repeated:
        raise ConfigError(
            section.key("joints"), joints, f"joint names must be unique (repeated: {', '.join(repeated)})"
        )
    return tuple(joints)


def deserialized(serialized: bytes, msg_type: type) -> Any:
    """rclpy's own reading of a serialized message the in-place parser did not take (ConversionError if none)."""
    try:
        return deserialize_message(serialized, msg_type)
    except RuntimeError as exc:  # rclpy's RMWError: the bytes are not a message of this type
        raise ConversionError(
            f"the serialized {msg_type.__name__} message ({len(serialized)} bytes) is malformed: {exc}"
        ) from None


def _as_float64(values: Any) -> np.ndarray:
    """A float64 view of a message's number array (rclpy gives array.array; a list also works)."""
    return np.asarray(values, dtype=np.float64)


class JointStateSource:
    """sensor_msgs/JointState: selected joints, ordered by name, field-major."""

    msg_type = JointState
    raw = True  # subscribed serialized: read in place (plugrl_ros.ros.cdr)
    FIELDS = ("position", "velocity", "effort")

    def __init__(self, section: Section) -> None:
        joints = read_joint_names(section)
        fields = section.str_list("fields", ["position"], nonempty=True)
        for field in fields:
            if field not in self.FIELDS:
                raise ConfigError(section.key("fields"), fields, f"each entry must be one of: {', '.join(self.FIELDS)}")
        if len(set(fields)) != len(fields):
            raise ConfigError(section.key("fields"), fields, "each field may be listed once")
        self.joints = joints
        self.fields = tuple(fields)
        self.width = len(joints) * len(fields)
        # Drivers publish joints in their own order (and some change it between
        # messages); the index array for each order is computed once.
        self._indices: dict[tuple[str, ...], np.ndarray] = {}
        # Serialized messages: (indices, joint count) by the serialized name sequence, decoded only when new.
        self._view_indices: dict[tuple[str, bytes], tuple[np.ndarray, int]] = {}
        self._previous: JointStateView | None = None  # its names, if the next has them, need no walk

    def _indices_for(self, names: tuple[str, ...]) -> np.ndarray:
        indices = self._indices.get(names)
        if indices is None:
            where: dict[str, int] = {}
            for i, name in enumerate(names):
                where.setdefault(name, i)
            missing = [j for j in self.joints if j not in where]
            if missing:
                raise ConversionError(
                    f"joint '{missing[0]}' is not in the JointState (has: {', '.join(names) or 'no joints'})"
                )
            indices = np.array([where[j] for j in self.joints], dtype=np.intp)
            if len(self._indices) >= _MAX_CACHED_JOINT_ORDERS:
                self._indices.clear()
            self._indices[names] = indices
        return indices

    def convert(self, msg: JointState | bytes) -> np.ndarray:
        """The selected joints of a message, typed or serialized (read in place; names decoded when new)."""
        if type(msg) is bytes:
            view = parse_joint_state(msg, self._previous)
            known = None if view is None else self._indices_for_view(view)
            if known is not None:
                self._previous = view
                return self._select(*known, view)
            msg = deserialized(msg, JointState)  # not the plain layout: rclpy decides
        names = tuple(msg.name)
        return self._select(self._indices_for(names), len(names), msg)

    def _indices_for_view(self, view: JointStateView) -> tuple[np.ndarray, int] | None:
        """(indices, joint count) for the view's names, decoded only when new; None if they do not decode."""
        key = (view.order, view.name_key)
        known = self._view_indices.get(key)
        if known is None:
            names = view.names()
            if names is None:
                return None
            known = (self._indices_for(names), len(names))
            if len(self._view_indices) >= _MAX_CACHED_JOINT_ORDERS:
                self._view_indices.clear()
            self._view_indices[key] = known
        return known

    def _select(self, indices: np.ndarray, count: int, msg: Any) -> np.ndarray:
        n = len(self.joints)
        out = np.empty(self.width, dtype=np.float64)
        for k, field in enumerate(self.fields):
            values = _as_float64(getattr(msg, field))
            if len(values) < count:
                raise ConversionError(
                    f"the JointState has {len(values)} {field} values for {count} joint names;"
                    f" remove '{field}' from fields if the driver does not publish it"
                )
            out[k * n : (k + 1) * n] = values[indices]
        return out


class _MultiArraySource:
    """std_msgs/Float*MultiArray: the data, or the configured ``slice`` of it."""

    msg_type: type
    raw = False

    def __init__(self, section: Section) -> None:
        self.slice = read_slice(section, required=False)
        self.width = None if self.slice is None else self.slice[1] - self.slice[0]

    def convert(self, msg: Any) -> np.ndarray:
        data = _as_float64(msg.data)
        # layout.data_offset counts padding before the first element; ignoring
        # it would feed that padding to the policy as if it were state.
        data = data[msg.layout.data_offset :]
        if self.slice is None:
            return data.copy()
        start, stop = self.slice
        if len(data) < stop:
            raise ConversionError(f"the array has {len(data)} values but slice [{start}, {stop}] needs at least {stop}")
        return data[start:stop].copy()


class Float64MultiArraySource(_MultiArraySource):
    msg_type = Float64MultiArray


class Float32MultiArraySource(_MultiArraySource):
    msg_type = Float32MultiArray


class _ScalarSource:
    """std_msgs/Float64 or Float32: one value."""

    msg_type: type
    raw = False
    width = 1

    def __init__(self, section: Section) -> None:
        del section  # no keys

    def convert(self, msg: Any) -> np.ndarray:
        return np.array([msg.data], dtype=np.float64)


class Float64Source(_ScalarSource):
    msg_type = Float64


class Float32Source(_ScalarSource):
    msg_type = Float32


def _xyz(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}.{axis}" for axis in "xyz")


def _xyzw(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}.{axis}" for axis in "xyzw")


def _is_message(value: Any) -> bool:
    return hasattr(value, "get_fields_and_field_types")


def _number_or_message_fields(msg: Any) -> str:
    """The fields a path may continue with: numbers and nested messages."""
    return ", ".join(
        name
        for name in msg.get_fields_and_field_types()
        if isinstance(getattr(msg, name), float) or _is_message(getattr(msg, name))
    )


def check_float_path(msg_type: type, path: str, key: str) -> None:
    """Raise ConfigError unless ``path`` (e.g. "pose.position.x") names a float field of ``msg_type``.

    The path is walked through a default-constructed message, so what is
    checked at startup is exactly what ``attrgetter`` reads at run time.
    """
    obj: Any = msg_type()
    walked: list[str] = []
    for part in path.split("."):
        if not _is_message(obj):
            raise ConfigError(key, path, f"'{'.'.join(walked)}' is a number; it has no field '{part}'")
        fields = obj.get_fields_and_field_types()
        where = f"'{'.'.join(walked)}' ({ros_type_name(type(obj))})" if walked else ros_type_name(type(obj))
        if part not in fields:
            raise ConfigError(
                key, path, f"{where} has no field '{part}'; choose one of: {_number_or_message_fields(obj)}"
            )
        value = getattr(obj, part)
        if not (isinstance(value, float) or _is_message(value)):
            raise ConfigError(
                key,
                path,
                f"'{part}' in {where} is a {fields[part]}, not a number;"
                f" choose one of: {_number_or_message_fields(obj)}",
            )
        obj = value
        walked.append(part)
    if _is_message(obj):
        raise ConfigError(
            key,
            path,
            f"'{path}' is a message ({ros_type_name(type(obj))});"
            f" continue it with one of: {_number_or_message_fields(obj)}",
        )


class _FieldPathSource:
    """A message read through a list of dotted float field paths (``fields``), checked at startup."""

    msg_type: type
    raw = False
    DEFAULT_FIELDS: tuple[str, ...]

    def __init__(self, section: Section) -> None:
        fields = section.str_list("fields", list(self.DEFAULT_FIELDS), nonempty=True)
        for path in fields:
            check_float_path(self.msg_type, path, section.key("fields"))
        self.fields = tuple(fields)
        self.width = len(fields)
        # attrgetter resolves dotted paths in C, with no per-message string work.
        self._get = operator.attrgetter(*fields)

    def convert(self, msg: Any) -> np.ndarray:
        values = self._get(msg)
        return np.array(values if self.width > 1 else (values,), dtype=np.float64)


class ImuSource(_FieldPathSource):
    msg_type = Imu
    DEFAULT_FIELDS = _xyzw("orientation") + _xyz("angular_velocity") + _xyz("linear_acceleration")


class OdometrySource(_FieldPathSource):
    msg_type = Odometry
    DEFAULT_FIELDS = (
        _xyz("pose.pose.position")
        + _xyzw("pose.pose.orientation")
        + _xyz("twist.twist.linear")
        + _xyz("twist.twist.angular")
    )


class PoseStampedSource(_FieldPathSource):
    msg_type = PoseStamped
    DEFAULT_FIELDS = _xyz("pose.position") + _xyzw("pose.orientation")


class TwistStampedSource(_FieldPathSource):
    msg_type = TwistStamped
    DEFAULT_FIELDS = _xyz("twist.linear") + _xyz("twist.angular")


class WrenchStampedSource(_FieldPathSource):
    msg_type = WrenchStamped
    DEFAULT_FIELDS = _xyz("wrench.force") + _xyz("wrench.torque")


class LaserScanSource:
    """sensor_msgs/LaserScan: the ranges resampled to ``beams`` values, optionally followed by the intensities.

    ``reduce: min`` takes the nearest return in each of ``beams`` equal sectors (an obstacle anywhere in a
    sector shows, the usual choice for obstacle avoidance); ``step`` takes the first reading of each
    sector (every k-th). A reading that is NaN, infinite or outside [range_min, range_max] (no return, or
    a return the sensor does not vouch for) becomes ``invalid_value`` (default: the message's
    range_max, "nothing within range") before reducing, so a sector's minimum is its nearest real return.
    """

    msg_type = LaserScan
    raw = False

    def __init__(self, section: Section) -> None:
        self.beams = section.int("beams")
        self.reduce = section.str("reduce")
        self.invalid_value = section.float("invalid_value") if section.has("invalid_value") else None
        self.intensities = section.bool("intensities")
        self.width = self.beams * (2 if self.intensities else 1)
        # readings -> [beams, longest sector] indices of each sector's readings (a short sector repeats its last)
        self._sectors: dict[int, np.ndarray] = {}

    def _sector_indices(self, readings: int) -> np.ndarray:
        sectors = self._sectors.get(readings)
        if sectors is None:
            edges = (np.arange(self.beams + 1) * readings) // self.beams
            longest = int(np.max(np.diff(edges)))
            offsets = np.minimum(np.arange(longest)[None, :], (np.diff(edges) - 1)[:, None])
            sectors = edges[:-1, None] + offsets
            if len(self._sectors) >= _MAX_CACHED_JOINT_ORDERS:  # a driver changing its resolution every scan
                self._sectors.clear()
            self._sectors[readings] = sectors
        return sectors

    def convert(self, msg: LaserScan) -> np.ndarray:
        ranges = np.asarray(msg.ranges, dtype=np.float64)
        if len(ranges) < self.beams:
            raise ShortMessage(f"the LaserScan has {len(ranges)} ranges, fewer than the {self.beams} beams configured")
        fill = float(msg.range_max) if self.invalid_value is None else self.invalid_value
        with np.errstate(invalid="ignore"):  # NaN compares false: it is invalid, as intended
            valid = (ranges >= msg.range_min) & (ranges <= msg.range_max)
        ranges = np.where(valid, ranges, fill)
        sectors = self._sector_indices(len(ranges))
        if self.reduce == "min":
            picks = sectors[np.arange(self.beams), np.argmin(ranges[sectors], axis=1)]
        else:
            picks = sectors[:, 0]
        out = ranges[picks]
        if not self.intensities:
            return out
        intensities = np.asarray(msg.intensities, dtype=np.float64)
        if len(intensities) != len(msg.ranges):
            raise ConversionError(
                f"the LaserScan has {len(intensities)} intensities for {len(msg.ranges)} ranges;"
                " set intensities: false if the driver does not publish them"
            )
        # each beam's intensity is that of the reading its range came from
        return np.concatenate([out, intensities[picks]])


STATE_SOURCES: dict[str, type] = {
    "sensor_msgs/JointState": JointStateSource,
    "std_msgs/Float64MultiArray": Float64MultiArraySource,
    "std_msgs/Float32MultiArray": Float32MultiArraySource,
    "std_msgs/Float64": Float64Source,
    "std_msgs/Float32": Float32Source,
    "sensor_msgs/Imu": ImuSource,
    "nav_msgs/Odometry": OdometrySource,
    "geometry_msgs/PoseStamped": PoseStampedSource,
    "geometry_msgs/TwistStamped": TwistStampedSource,
    "geometry_msgs/WrenchStamped": WrenchStampedSource,
    "sensor_msgs/LaserScan": LaserScanSource,
}


def require_fields(msg_type: type, section: Section, typed: Mapping[str, type]) -> None:
    """A type read or filled by field paths needs its ``fields``: say so, with the typed choices and its fields."""
    if section.has("fields"):
        return
    raise ConfigError(
        section.key("fields"),
        MISSING,
        f"{type_label(msg_type)} has no typed converter (those: {', '.join(sorted(typed))}): list the field "
        f"paths to use, e.g. ['{next(iter(msg_type.get_fields_and_field_types()), 'data')}']; "
        f"its fields: {describe_fields(msg_type)}",
    )


class FieldsSource:
    """Any message type: the numbers its ``fields`` paths select, in order (plugrl_ros.ros.field_paths).

    The typed sources above are the fast paths of their types; this covers every other installed type
    by the type's own introspection. Plain dotted paths to numbers are read with one ``attrgetter`` (as
    the typed field-path sources do); array slices and message sequences go through their readers.
    """

    raw = False

    def __init__(self, msg_type: type, section: Section) -> None:
        self.msg_type = msg_type
        require_fields(msg_type, section, STATE_SOURCES)
        paths = section.str_list("fields", nonempty=True)
        compiled = [compile_path(msg_type, path, section.key("fields")) for path in paths]
        self.fields = tuple(paths)
        self.width = sum(p.width for p in compiled)
        self._paths = compiled
        self._get = operator.attrgetter(*paths) if all(p.scalar_attribute for p in compiled) else None

    def convert(self, msg: Any) -> np.ndarray:
        if self._get is not None:
            values = self._get(msg)
            return np.array(values if len(self._paths) > 1 else (values,), dtype=np.float64)
        return np.concatenate([path.read(msg) for path in self._paths])


def make_state_source(type_name: str, section: Section) -> StateSource:
    """The state source for ``type_name``, configured from ``section`` (ConfigError for a bad type or key).

    A type with a typed source (the registry) gets it; any other installed message type is read by
    field paths (:class:`FieldsSource`).
    """
    cls = STATE_SOURCES.get(short_type_name(type_name))
    if cls is not None:
        return cls(section)
    return FieldsSource(interface_class(type_name, "msg", section.key("type")), section)


class TextSource:
    """std_msgs/String: the text as is (e.g. a language instruction)."""

    msg_type = String
    raw = False

    def __init__(self, section: Section | None = None) -> None:
        del section  # no keys

    def convert(self, msg: String) -> str:
        return msg.data
