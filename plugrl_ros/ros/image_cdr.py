"""sensor_msgs/Image and CompressedImage read straight from their serialized (CDR) bytes, pixels in place.

rclpy's typed take copies an image's ``uint8[]`` three times (DDS sample to
C struct, C struct to Python, into an ``array.array``); a subscription with
``raw=True`` hands over the serialized message in one ``bytes`` instead.
The two layouts are fixed and short (XCDR1, plain CDR, as rmw writes them):

    4-byte encapsulation header: 00 01 (little endian) or 00 00 (big endian), options 00 00
    Image:            stamp (int32, uint32), frame_id (string), height, width (uint32),
                      encoding (string), is_bigendian (uint8), step (uint32), data (sequence<uint8>)
    CompressedImage:  stamp (int32, uint32), frame_id (string), format (string), data (sequence<uint8>)

A string is a uint32 length counting its NUL, the bytes, the NUL; a sequence
a uint32 count, then the items. Every uint32 is aligned to 4 counted from
the end of the encapsulation header. The bytes come from another process,
so every length is checked against the buffer: anything that does not
parse exactly (another encapsulation, options that are not 0 -- their low
bits count padding rclpy then strips --, a string without its NUL, a length
past the end, a NUL inside a string, more than 3 bytes after the data)
gives None, and the caller
falls back to rclpy's typed deserialization, which then decides.
"""

from __future__ import annotations

import struct

_ORIGIN = 4  # alignment is counted from the end of the encapsulation header
# Trailing bytes an rmw may add to pad the message to a multiple of 4 (plain
# Fast DDS adds none); rclpy ignores trailing bytes, more are left to it.
_MAX_TRAILING = 3
_U32 = {"<": struct.Struct("<I"), ">": struct.Struct(">I")}
_U32X2 = {"<": struct.Struct("<II"), ">": struct.Struct(">II")}
# CDR_LE and CDR_BE with no options; PL_CDR, XCDR2 and options are left to rclpy
_ORDERS = {b"\x00\x01\x00\x00": "<", b"\x00\x00\x00\x00": ">"}
_STAMP_END = _ORIGIN + 8


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
