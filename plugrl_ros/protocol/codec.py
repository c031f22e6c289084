"""The PlugRL array codec: msgpack with openpi's ndarray conventions, validated.

Encoding is byte-identical to openpi's ``msgpack_numpy`` (docs/protocol.md, Arrays),
so any PlugRL trainer reads what we write. Decoding is not a mirror image of
openpi's: the bytes come from the network, so every ndarray is checked
before numpy is allowed to look at it. Object, void and complex kinds are
refused (building an object array from bytes is memory-unsafe), and a
``data`` field whose length disagrees with ``prod(shape) * itemsize`` is
refused instead of being read past or truncated.
"""

from __future__ import annotations

import functools
import math
import re
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from plugrl_ros.protocol.errors import ProtocolError

_NDARRAY = b"__ndarray__"
_NPGENERIC = b"__npgeneric__"
_DATA = b"data"
_DTYPE = b"dtype"
_SHAPE = b"shape"

# Kinds the protocol uses. O (object), V (void/structured) and c (complex)
# are never on the wire; everything else numpy knows is refused as well.
_ITEMSIZES = {
    "b": {1},
    "u": {1, 2, 4, 8},
    "i": {1, 2, 4, 8},
    "f": {2, 4, 8},
}
# The item size has no leading zero: numpy never writes one, and "<U0" (size 0)
# is not a dtype numpy can build an array of.
_TYPESTR = re.compile(r"([<>|])([a-zA-Z])([1-9][0-9]{0,5})")
_MAX_NDIM = 32

# An array at least this large is joined into the frame by reference instead
# of being copied into msgpack's buffer first, so that its bytes are copied
# once (into the frame) rather than two or three times (buffer, its regrowth,
# the bytes msgpack returns). Smaller arrays are cheaper to let msgpack copy.
_JOIN_MIN_BYTES = 64 * 1024
# The packer's first buffer: enough for headers and small arrays. With
# msgpack's default (256 KiB, above glibc's initial mmap threshold), a fresh
# process gave its heap back to the kernel after every frame and page-faulted
# it in again for the next: one-env infers took 185 us instead of 21 us.
_PACKER_BUF_BYTES = 16 * 1024
# Containers deeper than this are left to msgpack (whose own nesting limit
# then applies); our messages are a few levels deep.
_WALK_MAX_DEPTH = 32
_BIN8_MAX = 0xFF
_BIN16_MAX = 0xFFFF
_BIN32_MAX = 0xFFFFFFFF


class StackedRows:
    """An array given as its equally shaped rows: ``np.stack(rows)``, without the stacking.

    :func:`packb` writes the bytes the stacked array would have, copying each
    row once, straight into the frame: a batch of camera images is then
    copied once on its way out instead of twice (into the stack, then into
    the frame).
    """

    __slots__ = ("dtype", "rows", "shape")

    def __init__(self, rows: list[np.ndarray], dtype: np.dtype) -> None:
        assert rows, "an empty stack has no row shape; pass an empty array instead"
        # no copy for a row that is already C-contiguous and of the dtype
        self.rows = [np.ascontiguousarray(row, dtype=dtype) for row in rows]
        self.dtype = self.rows[0].dtype
        self.shape = (len(rows), *self.rows[0].shape)
        assert all(row.shape == self.shape[1:] for row in self.rows), "rows must share one shape"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def array(self) -> np.ndarray:
        """The stacked array (a copy)."""
        return np.stack(self.rows)


def _encode_default(obj: Any) -> Any:
    """msgpack's hook for what it cannot pack natively: numpy arrays and scalars."""
    if type(obj) is StackedRows:
        obj = obj.array()
    if isinstance(obj, np.ndarray):
        _refuse_unsendable(obj.dtype)
        return {_NDARRAY: True, _DATA: _array_bytes(obj), _DTYPE: obj.dtype.str, _SHAPE: obj.shape}
    if isinstance(obj, np.generic):
        _refuse_unsendable(obj.dtype)
        return {_NPGENERIC: True, _DATA: obj.item(), _DTYPE: obj.dtype.str}
    raise TypeError(f"cannot encode a {type(obj).__name__}")


def _refuse_unsendable(dtype: np.dtype) -> None:
    if dtype.kind in "OVc":
        raise TypeError(f"dtype {dtype.str} cannot be sent: kinds O, V and c are not part of the protocol")


def _array_bytes(obj: np.ndarray) -> bytes | memoryview:
    """An array's data in C order, as openpi's ``tobytes()`` gives it.

    A large C-contiguous array is given as a memoryview, which msgpack (or
    :func:`packb`'s join) reads without the copy ``tobytes()`` would make. A
    small one is given as bytes: for a few bytes, ``tobytes()`` costs less
    than creating and releasing a memoryview. A subclass may override
    ``tobytes()`` (a masked array fills its masked items), so it gets it.
    """
    if obj.nbytes >= _JOIN_MIN_BYTES and type(obj) is np.ndarray and obj.flags.c_contiguous:
        return obj.data
    return obj.tobytes()


def packb(obj: Any) -> bytes:
    """Serialize a message; arrays become openpi-style ndarray maps.

    The bytes are those of ``msgpack.packb(obj, default=...)``, but large
    arrays are copied only once, straight into the returned frame.
    """
    packer = msgpack.Packer(default=_encode_default, use_bin_type=True, autoreset=False, buf_size=_PACKER_BUF_BYTES)
    chunks: list[Any] = []
    _pack_walk(obj, packer, chunks, 0)
    if not chunks:
        return packer.bytes()
    chunks.append(packer.bytes())
    return b"".join(chunks)


def _pack_walk(obj: Any, packer: msgpack.Packer, chunks: list[Any], depth: int) -> None:
    """Pack ``obj`` into ``packer``, moving each large array's data to ``chunks`` by reference.

    Only exact dicts, lists and tuples are walked (as msgpack would pack
    them); anything else, subclasses included, goes to msgpack unchanged, so
    the output cannot drift from msgpack's.
    """
    kind = type(obj)
    if kind is dict and depth < _WALK_MAX_DEPTH:
        packer.pack_map_header(len(obj))
        for key, value in obj.items():
            # Leaves are handed to msgpack here rather than in a recursive
            # call: a call per leaf was most of the cost of a small message.
            if type(key) in _WALKED:
                _pack_walk(key, packer, chunks, depth + 1)
            else:
                packer.pack(key)
            if type(value) in _WALKED:
                _pack_walk(value, packer, chunks, depth + 1)
            else:
                packer.pack(value)
    elif (kind is list or kind is tuple) and depth < _WALK_MAX_DEPTH:
        packer.pack_array_header(len(obj))
        for item in obj:
            if type(item) in _WALKED:
                _pack_walk(item, packer, chunks, depth + 1)
            else:
                packer.pack(item)
    elif kind is np.ndarray and obj.nbytes >= _JOIN_MIN_BYTES:
        # The same map as _encode_default's, written in place: what precedes
        # the data leaves the packer, the data goes to chunks by reference.
        _refuse_unsendable(obj.dtype)
        chunks.append(packer.bytes())
        packer.reset()
        chunks.append(_NDARRAY_HEAD)
        chunks.append(_bin_header(obj.nbytes))
        chunks.append(_array_bytes(obj))
        packer.pack(_DTYPE)
        packer.pack(obj.dtype.str)
        packer.pack(_SHAPE)
        packer.pack(obj.shape)
    elif kind is StackedRows and obj.nbytes >= _JOIN_MIN_BYTES:
        # as for an ndarray, with the data given row by row
        _refuse_unsendable(obj.dtype)
        chunks.append(packer.bytes())
        packer.reset()
        chunks.append(_NDARRAY_HEAD)
        chunks.append(_bin_header(obj.nbytes))
        chunks.extend(row.data for row in obj.rows)
        packer.pack(_DTYPE)
        packer.pack(obj.dtype.str)
        packer.pack(_SHAPE)
        packer.pack(obj.shape)
    elif kind is StackedRows:
        packer.pack(obj.array())
    else:
        packer.pack(obj)


_WALKED = frozenset({dict, list, tuple, np.ndarray, StackedRows})


def _packed_ndarray_head() -> bytes:
    """msgpack's bytes of an ndarray map up to its data: map header, ``__ndarray__: True``, ``data`` key."""
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    packer.pack_map_header(4)
    packer.pack(_NDARRAY)
    packer.pack(True)
    packer.pack(_DATA)
    return packer.bytes()


_NDARRAY_HEAD = _packed_ndarray_head()


def _bin_header(size: int) -> bytes:
    """The msgpack bin header, as msgpack itself writes it, of ``size`` bytes of data."""
    if size <= _BIN8_MAX:
        return struct.pack(">BB", 0xC4, size)
    if size <= _BIN16_MAX:
        return struct.pack(">BH", 0xC5, size)
    if size <= _BIN32_MAX:
        return struct.pack(">BI", 0xC6, size)
    raise ValueError(f"an array of {size} bytes is too large for msgpack bin (at most {_BIN32_MAX})")


def parse_typestr(typestr: Any) -> np.dtype:
    """The numpy dtype a wire typestr names, or ProtocolError if it is not allowed."""
    if not isinstance(typestr, str):
        raise ProtocolError("dtype", f"must be a str typestr, got {type(typestr).__name__}")
    return _dtype_for(typestr)


@functools.lru_cache(maxsize=256)
def _dtype_for(typestr: str) -> np.dtype:
    match = _TYPESTR.fullmatch(typestr)
    if match is None:
        raise ProtocolError("dtype", f"{typestr!r} is not a typestr (byte order, kind, item size)")
    order, kind, size_text = match.groups()
    size = int(size_text)
    if kind in "OVc":
        raise ProtocolError("dtype", f"{typestr!r}: kind {kind!r} is refused (object, void and complex never travel)")
    if kind == "U":
        if order == "|":
            raise ProtocolError("dtype", f"{typestr!r}: a unicode typestr needs byte order < or >")
        return np.dtype(order + "U" + size_text)
    if kind not in _ITEMSIZES:
        raise ProtocolError("dtype", f"{typestr!r}: kind {kind!r} is not one of b, u, i, f, U")
    if size not in _ITEMSIZES[kind]:
        raise ProtocolError("dtype", f"{typestr!r}: item size {size} is not valid for kind {kind!r}")
    if order == "|" and size != 1:
        raise ProtocolError("dtype", f"{typestr!r}: byte order '|' is only for one-byte types")
    return np.dtype(order + kind + size_text)


def decode_ndarray(obj: dict) -> np.ndarray:
    """Validate an ``__ndarray__`` map and return a read-only view of its bytes."""
    try:
        data, shape, typestr = obj[_DATA], obj[_SHAPE], obj[_DTYPE]
    except KeyError as exc:
        raise ProtocolError(exc.args[0].decode(), "is missing from an __ndarray__ map (keys are bin)") from None
    # The common case skips parse_typestr's call and type check (hot path).
    dtype = _dtype_for(typestr) if type(typestr) is str else parse_typestr(typestr)
    if not isinstance(data, bytes):
        raise ProtocolError("data", f"must be msgpack bin, got {type(data).__name__}")
    if type(shape) is not list and not isinstance(shape, tuple):
        raise ProtocolError("shape", f"must be a list of non-negative ints, got {type(shape).__name__}")
    if len(shape) > _MAX_NDIM:
        raise ProtocolError("shape", f"has {len(shape)} dimensions, more than {_MAX_NDIM}")
    expected = dtype.itemsize
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise ProtocolError("shape", f"{list(shape)!r} is not a list of non-negative ints")
        expected *= dim
    if len(data) != expected:
        raise ProtocolError(
            "data",
            f"holds {len(data)} bytes, but shape {list(shape)} of {dtype.str} needs {expected}",
        )
    try:
        # One call instead of frombuffer().reshape(): half the cost per array.
        # Over bytes, the array is a read-only view (no copy).
        return np.ndarray(shape, dtype, data)
    except ValueError as exc:
        # Only an empty array gets here: a zero dimension next to dimensions
        # whose product numpy cannot represent.
        raise ProtocolError("shape", f"{list(shape)!r} is too large for numpy: {exc}") from None


def decode_npgeneric(obj: dict) -> np.generic:
    """Validate an ``__npgeneric__`` map and return the numpy scalar it holds."""
    dtype = parse_typestr(obj.get(_DTYPE))
    value = obj.get(_DATA)
    # openpi sends item(): a bool, an int, a float. An int may stand for a
    # float (a JavaScript peer packs 2.0 as 2), but a float never stands for
    # an int: numpy would truncate 1.5 to 1 without a word.
    allowed = _SCALAR_TYPES[dtype.kind]
    if type(value) not in allowed:
        raise ProtocolError("data", f"a {dtype.str} scalar cannot hold a {type(value).__name__}")
    if dtype.kind == "U" and len(value) > dtype.itemsize // 4:
        raise ProtocolError("data", f"{value[:32]!r} has more than the {dtype.itemsize // 4} characters of {dtype.str}")
    try:
        with np.errstate(over="ignore"):
            scalar = dtype.type(value)
    except (OverflowError, ValueError) as exc:
        raise ProtocolError("data", f"{value!r} does not fit {dtype.str}: {exc}") from None
    if dtype.kind == "f" and math.isfinite(value) and not np.isfinite(scalar):
        raise ProtocolError("data", f"{value!r} does not fit {dtype.str}: it overflows to {scalar}")
    return scalar


# The Python types (as msgpack decodes them) a scalar of each kind may hold.
_SCALAR_TYPES = {"b": (bool,), "u": (int,), "i": (int,), "f": (float, int), "U": (str,)}


def _decode_hook(obj: dict) -> Any:
    if _NDARRAY in obj:
        return decode_ndarray(obj)
    if _NPGENERIC in obj:
        return decode_npgeneric(obj)
    return obj


# msgpack signals malformed input with ValueError subclasses (ExtraData,
# FormatError, StackError) and, for some inputs, TypeError or OverflowError.
_MSGPACK_ERRORS = (ValueError, TypeError, OverflowError, msgpack.UnpackException)


def unpackb(frame: bytes, object_hook: Callable[[dict], Any] = _decode_hook) -> Any:
    """Deserialize one frame, validating every ndarray; ProtocolError on bad input."""
    try:
        return msgpack.unpackb(frame, raw=False, object_hook=object_hook, strict_map_key=False)
    except ProtocolError:
        raise
    except msgpack.StackError:
        # msgpack's C unpacker stops at 1024 levels rather than recursing.
        raise ProtocolError("frame", "nests too deeply") from None
    except _MSGPACK_ERRORS as exc:
        raise ProtocolError("frame", f"is not valid msgpack: {str(exc) or type(exc).__name__}") from None
    except RecursionError:
        raise ProtocolError("frame", "nests too deeply") from None
