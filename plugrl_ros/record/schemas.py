"""ROS 2 message definitions for the recording's channels, read from the installed message packages.

An MCAP file with the ``ros2msg`` schema encoding carries, per schema, the
message's ``.msg`` text followed by the text of every type it uses (the same
concatenation rosbag2 writes), so Foxglove and ``ros2 bag`` decode the file
without plugrl_ros. The texts come from the ROS installation's own
``share/<package>/msg/<Type>.msg`` files (found through ament_index, a file
lookup: no rclpy), so a recording always matches the distribution it was
made on.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from ament_index_python.packages import PackageNotFoundError, get_package_share_directory

IMAGE = "sensor_msgs/msg/Image"
COMPRESSED_IMAGE = "sensor_msgs/msg/CompressedImage"
FLOAT64_ARRAY = "std_msgs/msg/Float64MultiArray"
FLOAT64 = "std_msgs/msg/Float64"
STRING = "std_msgs/msg/String"
DIAGNOSTIC_STATUS = "diagnostic_msgs/msg/DiagnosticStatus"

ALL = (IMAGE, COMPRESSED_IMAGE, FLOAT64_ARRAY, FLOAT64, STRING, DIAGNOSTIC_STATUS)

_PRIMITIVES = frozenset(
    "bool byte char float32 float64 int8 uint8 int16 uint16 int32 uint32 int64 uint64 string wstring".split()
)
_SEPARATOR = "=" * 80


class SchemaNotFound(Exception):
    """A message definition the recording needs is not installed."""


def _msg_file(full_name: str) -> Path:
    package, _, name = full_name.split("/")
    try:
        share = Path(get_package_share_directory(package))
    except PackageNotFoundError:
        raise SchemaNotFound(
            f"recording needs the ROS package {package!r} (for {full_name}), which ament_index cannot find; "
            "source your ROS 2 setup (or set AMENT_PREFIX_PATH) before starting"
        ) from None
    path = share / "msg" / f"{name}.msg"
    if not path.is_file():
        raise SchemaNotFound(f"recording needs {path} (the definition of {full_name}), which is missing")
    return path


def _used_types(package: str, text: str) -> list[str]:
    """The message types a definition's fields use, as ``pkg/msg/Type``, in order of first use."""
    used: list[str] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        field_type = re.split(r"[\[<\s]", line, maxsplit=1)[0]
        if field_type in _PRIMITIVES:  # constants are always primitives, so they end here too
            continue
        if "/" in field_type:
            pkg, name = field_type.split("/")[0], field_type.split("/")[-1]
        elif field_type == "Header":  # ROS 1 shorthand some definitions still use
            pkg, name = "std_msgs", "Header"
        else:
            pkg, name = package, field_type
        full = f"{pkg}/msg/{name}"
        if full not in used:
            used.append(full)
    return used


@functools.cache
def definition(full_name: str) -> str:
    """The concatenated definition of ``full_name`` (e.g. ``sensor_msgs/msg/Image``), as rosbag2 writes it."""
    main = _msg_file(full_name).read_text()
    parts = [main.rstrip("\n")]
    seen = {full_name}
    pending = _used_types(full_name.split("/", maxsplit=1)[0], main)
    while pending:
        dep = pending.pop(0)
        if dep in seen:
            continue
        seen.add(dep)
        text = _msg_file(dep).read_text()
        pkg, _, name = dep.split("/")
        parts.append(f"{_SEPARATOR}\nMSG: {pkg}/{name}\n{text.rstrip()}")
        pending.extend(_used_types(pkg, text))
    return "\n".join(parts) + "\n"
