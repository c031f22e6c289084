"""sensor_msgs/Image, CompressedImage and JointState read straight from their serialized (CDR) bytes.

rclpy's typed take copies an image's ``uint8[]`` three times (DDS sample to
C struct, C struct to Python, into an ``array.array``) and builds a Python
string per joint name; a subscription with ``raw=True`` hands over the
serialized message in one ``bytes`` instead, read here in place. The layouts
are fixed and short (XCDR1, plain CDR, as rmw writes them):

    4-byte encapsulation header: 00 01 (little endian) or 00 00 (big endian), options 00 00
    Image:            stamp (int32, uint32), frame_id (string), height, width (uint32),
                      encoding (string), is_bigendian (uint8), step (uint32), data (sequence<uint8>)
    CompressedImage:  stamp (int32, uint32), frame_id (string), format (string), data (sequence<uint8>)
    JointState:       stamp (int32, uint32), frame_id (string), name (sequence<string>),
                      position, velocity, effort (sequence<float64> each)

A string is a uint32 length counting its NUL, the bytes, the NUL; a sequence
a uint32 count, then the items. Every uint32 is aligned to 4 and every
float64 to 8, counted from the end of the encapsulation header. The bytes
come from another process, so every length is checked against the buffer:
anything that does not parse exactly (another encapsulation, options that
are not 0 -- their low bits count padding rclpy then strips --, a string
without its NUL, a length past the end, a NUL inside a string, more bytes
after the last field than a writer pads) gives None, and the caller falls
back to rclpy's typed deserialization, which then decides.
"""

from __future__ import annotations

import struct

import numpy as np

_ORIGIN = 4  # alignment is counted from the end of the encapsulation header
# Trailing bytes an rmw may add to pad the message to a multiple of 4 (plain
# Fast DDS adds none); rclpy ignores trailing bytes, more are left to it.
_MAX_TRAILING = 3
_U32 = {"<": struct.Struct("<I"), ">": struct.Struct(">I")}
_U32X2 = {"<": struct.Struct("<II"), ">": struct.Struct(">II")}
# CDR_LE and CDR_BE with no options; PL_CDR, XCDR2 and options are left to rclpy
_ORDERS = {b"\x00\x01\x00\x00": "<", b"\x00\x00\x00\x00": ">"}
_STAMP_END = _ORIGIN + 8
_F64 = {"<": np.dtype("<f8"), ">": np.dtype(">f8")}
# After a JointState, Fast CDR leaves the room it reserved for aligning each float64 sequence to 8:
# up to 7 bytes for each of the three (seen: 0, 4, 8 or 12 in all), and up to 3 of padding. rclpy
# ignores trailing bytes; a message with more than this is left to it.
_MAX_JOINT_STATE_TRAILING = 3 * 7 + _MAX_TRAILING
_MIN_STRING = 5  # a uint32 length and the NUL


class ImageView:
    """The fields of a sensor_msgs/Image that a conversion reads; ``data`` is a view into the serialized bytes."""

    __slots__ = ("data", "encoding", "height", "is_bigendian", "step", "width")

    def __init__(self, height: int, width: int, encoding: str, is_bigendian: int, step: int, data: memoryview) -> None:
        self.height = height
        self.width = width
        self.encoding = encoding
        self.is_bigendian = is_bigendian
        self.step = step
        self.data = data


class CompressedImageView:
    """The fields of a sensor_msgs/CompressedImage that a conversion reads; ``data`` is a view into the bytes."""

    __slots__ = ("data", "format")

    def __init__(self, format: str, data: memoryview) -> None:
        self.format = format
        self.data = data


def _aligned(pos: int) -> int:
    return pos + (-(pos - _ORIGIN) & 3)


def _aligned8(pos: int) -> int:
    return pos + (-(pos - _ORIGIN) & 7)


def _string(buf: bytes, pos: int, u32: struct.Struct) -> tuple[str | None, int]:
    """The string at ``pos`` (aligned first) and the position after it; None if it does not fit or decode."""
    pos = _aligned(pos)
    if pos + 4 > len(buf):
        return None, pos
    (length,) = u32.unpack_from(buf, pos)
    pos += 4
    end = pos + length
    if length == 0 or end > len(buf) or buf[end - 1] != 0:
        return None, pos
    text = buf[pos : end - 1]
    if 0 in text:  # rclpy would stop at the first NUL: leave such a string to it
        return None, pos
    try:
        return text.decode(), end
    except UnicodeDecodeError:
        return None, pos


def _skip_string(buf: bytes, pos: int, u32: struct.Struct) -> int:
    """The position after the string at ``pos``, or -1 if it does not fit."""
    pos = _aligned(pos)
    if pos + 4 > len(buf):
        return -1
    (length,) = u32.unpack_from(buf, pos)
    end = pos + 4 + length
    if length == 0 or end > len(buf) or buf[end - 1] != 0:
        return -1
    return end


def _data(buf: bytes, pos: int, u32: struct.Struct) -> memoryview | None:
    """The trailing ``sequence<uint8>`` at ``pos`` as a view, if it ends the buffer (give or take the padding)."""
    pos = _aligned(pos)
    if pos + 4 > len(buf):
        return None
    (count,) = u32.unpack_from(buf, pos)
    pos += 4
    end = pos + count
    if not end <= len(buf) <= end + _MAX_TRAILING:
        return None
    return memoryview(buf)[pos:end]


def _after_header(buf: bytes) -> tuple[str, struct.Struct, int] | None:
    """The byte order, its uint32 reader and the position after the std_msgs/Header; None if not plain CDR."""
    order = _ORDERS.get(buf[:_ORIGIN]) if len(buf) >= _STAMP_END else None
    if order is None:
        return None
    u32 = _U32[order]
    pos = _skip_string(buf, _STAMP_END, u32)  # header.frame_id
    return None if pos < 0 else (order, u32, pos)


def parse_image(buf: bytes) -> ImageView | None:
    """A serialized sensor_msgs/Image as an :class:`ImageView`, or None if it is not the plain layout."""
    header = _after_header(buf)
    if header is None:
        return None
    order, u32, pos = header
    pos = _aligned(pos)
    if pos + 8 > len(buf):
        return None
    height, width = _U32X2[order].unpack_from(buf, pos)
    encoding, pos = _string(buf, pos + 8, u32)
    if encoding is None or pos + 1 > len(buf):
        return None
    is_bigendian = buf[pos]
    pos = _aligned(pos + 1)
    if pos + 4 > len(buf):
        return None
    (step,) = u32.unpack_from(buf, pos)
    data = _data(buf, pos + 4, u32)
    if data is None:
        return None
    return ImageView(height, width, encoding, is_bigendian, step, data)


def parse_compressed_image(buf: bytes) -> CompressedImageView | None:
    """A serialized sensor_msgs/CompressedImage as a :class:`CompressedImageView`, or None if it is not plain."""
    header = _after_header(buf)
    if header is None:
        return None
    _, u32, pos = header
    format_, pos = _string(buf, pos, u32)
    if format_ is None:
        return None
    data = _data(buf, pos, u32)
    if data is None:
        return None
    return CompressedImageView(format_, data)


class JointStateView:
    """The fields of a sensor_msgs/JointState that a conversion reads; the number arrays are views into the bytes.

    ``name_key`` identifies the names and their order (each string's length and bytes, without the
    padding between them, which writers may leave uninitialised): a reader can key what it derives
    from the names on it (with ``order``) and decode them only when new. ``name_bytes`` is the name
    sequence as it stands, padding included, for :func:`parse_joint_state`'s ``previous``.
    """

    __slots__ = ("_buf", "_names_at", "effort", "name_bytes", "name_key", "order", "position", "velocity")

    def __init__(
        self,
        buf: bytes,
        order: str,
        names_at: int,
        name_bytes: bytes,
        name_key: bytes,
        position: np.ndarray,
        velocity: np.ndarray,
        effort: np.ndarray,
    ) -> None:
        self._buf = buf
        self.order = order
        self._names_at = names_at
        self.name_bytes = name_bytes
        self.name_key = name_key
        self.position = position
        self.velocity = velocity
        self.effort = effort

    def names(self) -> tuple[str, ...] | None:
        """The joint names (decoded now); None if one is not valid UTF-8 or holds a NUL (rclpy decides then)."""
        buf, pos = self._buf, self._names_at
        u32 = _U32[self.order]
        (count,) = u32.unpack_from(buf, pos)
        pos += 4
        names = []
        for _ in range(count):
            name, pos = _string(buf, pos, u32)
            if name is None:
                return None
            names.append(name)
        return tuple(names)


def _float64s(buf: bytes, pos: int, order: str, u32: struct.Struct) -> tuple[np.ndarray | None, int]:
    """The ``sequence<float64>`` at ``pos`` as a read-only view, and the position after it."""
    pos = _aligned(pos)
    if pos + 4 > len(buf):
        return None, pos
    (count,) = u32.unpack_from(buf, pos)
    pos += 4
    if count:
        pos = _aligned8(pos)
    end = pos + 8 * count
    if end > len(buf):
        return None, pos
    return np.frombuffer(buf, _F64[order], count, pos), end


def parse_joint_state(buf: bytes, previous: JointStateView | None = None) -> JointStateView | None:
    """A serialized sensor_msgs/JointState as a :class:`JointStateView`, or None if it is not the plain layout.

    ``previous``: an earlier message's view. The name sequence delimits itself, so if the same bytes
    (in the same byte order) stand where this message's names start, they are its names: no walk.
    """
    header = _after_header(buf)
    if header is None:
        return None
    order, u32, pos = header
    names_at = _aligned(pos)
    if previous is not None and previous.order == order and buf.startswith(previous.name_bytes, names_at):
        name_bytes, name_key = previous.name_bytes, previous.name_key
        pos = names_at + len(name_bytes)
    else:
        if names_at + 4 > len(buf):
            return None
        (count,) = u32.unpack_from(buf, names_at)
        if count > (len(buf) - names_at - 4) // _MIN_STRING:
            return None  # more names than the bytes could hold
        pos = names_at + 4
        pieces = []
        for _ in range(count):
            start = _aligned(pos)
            pos = _skip_string(buf, pos, u32)
            if pos < 0:
                return None
            pieces.append(buf[start:pos])
        name_bytes, name_key = buf[names_at:pos], b"".join(pieces)
    position, pos = _float64s(buf, pos, order, u32)
    if position is None:
        return None
    velocity, pos = _float64s(buf, pos, order, u32)
    if velocity is None:
        return None
    effort, pos = _float64s(buf, pos, order, u32)
    if effort is None or not pos <= len(buf) <= pos + _MAX_JOINT_STATE_TRAILING:
        return None
    return JointStateView(buf, order, names_at, name_bytes, name_key, position, velocity, effort)
