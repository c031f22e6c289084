"""Tests of the PlugRL array codec: openpi byte identity, round trips, validation, fuzzing.

The golden byte vectors were produced by openpi's own codec (``openpi_client.msgpack_numpy.packb``
from openpi-client 0.1.2, with msgpack 1.2.4 and numpy 1.26.4) in a scratch environment outside this
repository; each vector is pasted here as data next to the expression that built the value. Large
frames are pinned by the SHA-256 of openpi's bytes instead of the bytes themselves.

``CODEC_FUZZ_EXAMPLES=<n>`` runs the property tests with n examples each (a longer campaign).
"""

from __future__ import annotations

import collections
import hashlib
import math
import os
import tracemalloc
from typing import Any
from unittest import mock

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.errors import ProtocolError

FUZZ_EXAMPLES = int(os.environ.get("CODEC_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,  # two shared cores: a slow example is not a failure
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# name: (builder of the value, openpi's bytes as hex)
GOLDEN: dict[str, tuple[Any, str]] = {
    "text_spec": (
        lambda: np.array(["pick up the red block", "stack"]),
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c4a87000000069000000630000006b000000200000007500000070"
            "000000200000007400000068000000650000002000000072000000650000006400000020000000620000006c0000006f"
            "000000630000006b000000730000007400000061000000630000006b0000000000000000000000000000000000000000"
            "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000c4"
            "056474797065a43c553231c40573686170659102"
        ),
    ),
    "bool_b1": (
        lambda: np.array([True, False, True]),
        "84c40b5f5f6e6461727261795f5fc3c40464617461c403010001c4056474797065a37c6231c40573686170659103",
    ),
    "uint8_u1": (
        lambda: np.arange(4, dtype="|u1").reshape(2, 2),
        "84c40b5f5f6e6461727261795f5fc3c40464617461c40400010203c4056474797065a37c7531c4057368617065920202",
    ),
    "uint16_u2": (
        lambda: np.array([0, 1, 65535], dtype="<u2"),
        ("84c40b5f5f6e6461727261795f5fc3c40464617461c40600000100ffffc4056474797065a33c7532c40573686170659103"),
    ),
    "uint32_u4": (
        lambda: np.array([0, 1, 2**32 - 1], dtype="<u4"),
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c40c0000000001000000ffffffffc4056474797065a33c7534c405"
            "73686170659103"
        ),
    ),
    "uint64_u8": (
        lambda: np.array([0, 1, 2**64 - 1], dtype="<u8"),
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c41800000000000000000100000000000000ffffffffffffffffc4"
            "056474797065a33c7538c40573686170659103"
        ),
    ),
    "int8_i1": (
        lambda: np.array([-128, 0, 127], dtype="|i1"),
        "84c40b5f5f6e6461727261795f5fc3c40464617461c40380007fc4056474797065a37c6931c40573686170659103",
    ),
    "int16_i2": (
        lambda: np.array([-32768, -1, 32767], dtype="<i2"),
        ("84c40b5f5f6e6461727261795f5fc3c40464617461c4060080ffffff7fc4056474797065a33c6932c40573686170659103"),
    ),
    "int32_i4": (
        lambda: np.array([-(2**31), -1, 2**31 - 1], dtype="<i4"),
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c40c00000080ffffffffffffff7fc4056474797065a33c6934c405"
            "73686170659103"
        ),
    ),
    "int64_i8": (
        lambda: np.array([-(2**63), -1, 2**63 - 1], dtype="<i8"),
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c4180000000000000080ffffffffffffffffffffffffffffff7fc4"
            "056474797065a33c6938c40573686170659103"
        ),
    ),
    "float16_f2": (
        lambda: np.array([1.5, -0.25], dtype="<f2"),
        "84c40b5f5f6e6461727261795f5fc3c40464617461c404003e00b4c4056474797065a33c6632c40573686170659102",
    ),
    "float32_f4": (
        lambda: np.array([[1.5, -2.25], [0.0, np.inf]], dtype="<f4"),
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c4100000c03f000010c0000000000000807fc4056474797065a33c"
            "6634c4057368617065920202"
        ),
    ),
    "float64_f8": (
        lambda: np.array([0.1, -0.0, np.nan, 1e300], dtype="<f8"),
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c4209a9999999999b93f0000000000000080000000000000f87f9c"
            "7500883ce4377ec4056474797065a33c6638c40573686170659104"
        ),
    ),
    "unicode_U": (
        lambda: np.array(["a", "h\u00e9llo", "\U0001f642"]),
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c43c610000000000000000000000000000000000000068000000e9"
            "0000006c0000006c0000006f00000042f6010000000000000000000000000000000000c4056474797065a33c5535c405"
            "73686170659103"
        ),
    ),
    "big_endian_f4": (
        lambda: np.array([1.5, -2.0], dtype=">f4"),
        ("84c40b5f5f6e6461727261795f5fc3c40464617461c4083fc00000c0000000c4056474797065a33e6634c40573686170659102"),
    ),
    "big_endian_i8": (
        lambda: np.array([1, -2, 2**40], dtype=">i8"),
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c4180000000000000001fffffffffffffffe0000010000000000c4"
            "056474797065a33e6938c40573686170659103"
        ),
    ),
    "big_endian_U": (
        lambda: np.array(["ab", "c"], dtype=">U2"),
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c41000000061000000620000006300000000c4056474797065a33e"
            "5532c40573686170659102"
        ),
    ),
    "transposed": (
        lambda: np.arange(6, dtype="<i4").reshape(2, 3).T,
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c418000000000300000001000000040000000200000005000000c4"
            "056474797065a33c6934c4057368617065920302"
        ),
    ),
    "strided": (
        lambda: np.arange(10, dtype="<f8")[::3],
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c42000000000000000000000000000000840000000000000184000"
            "00000000002240c4056474797065a33c6638c40573686170659104"
        ),
    ),
    "fortran_order": (
        lambda: np.asfortranarray(np.arange(6, dtype="<i2").reshape(2, 3)),
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c40c000001000200030004000500c4056474797065a33c6932c405"
            "7368617065920203"
        ),
    ),
    "zero_d_f4": (
        lambda: np.array(3.5, dtype="<f4"),
        "84c40b5f5f6e6461727261795f5fc3c40464617461c40400006040c4056474797065a33c6634c405736861706590",
    ),
    "zero_d_U": (
        lambda: np.array("xyz"),
        (
            "84c40b5f5f6e6461727261795f5fc3c40464617461c40c78000000790000007a000000c4056474797065a33c5533c405"
            "736861706590"
        ),
    ),
    "empty_1d": (
        lambda: np.zeros((0,), dtype="<f4"),
        "84c40b5f5f6e6461727261795f5fc3c40464617461c400c4056474797065a33c6634c40573686170659100",
    ),
    "empty_2x0": (
        lambda: np.zeros((2, 0), dtype="|u1"),
        "84c40b5f5f6e6461727261795f5fc3c40464617461c400c4056474797065a37c7531c4057368617065920200",
    ),
    "scalar_float32": (
        lambda: np.float32(1.5),
        "83c40d5f5f6e7067656e657269635f5fc3c40464617461cb3ff8000000000000c4056474797065a33c6634",
    ),
    "scalar_int64": (
        lambda: np.int64(7),
        "83c40d5f5f6e7067656e657269635f5fc3c4046461746107c4056474797065a33c6938",
    ),
    "scalar_bool": (
        lambda: np.bool_(True),
        "83c40d5f5f6e7067656e657269635f5fc3c40464617461c3c4056474797065a37c6231",
    ),
    "scalar_uint8": (
        lambda: np.uint8(200),
        "83c40d5f5f6e7067656e657269635f5fc3c40464617461ccc8c4056474797065a37c7531",
    ),
    "scalar_float64": (
        lambda: np.float64(2.5),
        "cb4004000000000000",
    ),
    "scalar_str": (
        lambda: np.str_("hi"),
        "a26869",
    ),
    "infer_message": (
        lambda: {
            "message_type": "infer",
            "data": {
                "images": {"wrist": np.arange(24, dtype="|u1").reshape(2, 2, 2, 3)},
                "states": {"joints": np.array([[0.5, -1.0, 2.0], [3.0, 0.25, -0.125]], dtype="<f8")},
                "text": np.array(["pick up the red block", "stack"]),
            },
            "env_indices": np.array([0, 3], dtype="<i8"),
            "step_ids": np.array([0, 5], dtype="<i8"),
            "reuse": np.array([False, False]),
        },
        (
            "85ac6d6573736167655f74797065a5696e666572a46461746183a6696d6167657381a5777269737484c40b5f5f6e6461"
            "727261795f5fc3c40464617461c418000102030405060708090a0b0c0d0e0f1011121314151617c4056474797065a37c"
            "7531c40573686170659402020203a673746174657381a66a6f696e747384c40b5f5f6e6461727261795f5fc3c4046461"
            "7461c430000000000000e03f000000000000f0bf00000000000000400000000000000840000000000000d03f00000000"
            "0000c0bfc4056474797065a33c6638c4057368617065920203a47465787484c40b5f5f6e6461727261795f5fc3c40464"
            "617461c4a87000000069000000630000006b000000200000007500000070000000200000007400000068000000650000"
            "002000000072000000650000006400000020000000620000006c0000006f000000630000006b00000073000000740000"
            "0061000000630000006b0000000000000000000000000000000000000000000000000000000000000000000000000000"
            "0000000000000000000000000000000000000000000000000000000000c4056474797065a43c553231c4057368617065"
            "9102ab656e765f696e646963657384c40b5f5f6e6461727261795f5fc3c40464617461c4100000000000000000030000"
            "0000000000c4056474797065a33c6938c40573686170659102a8737465705f69647384c40b5f5f6e6461727261795f5f"
            "c3c40464617461c41000000000000000000500000000000000c4056474797065a33c6938c40573686170659102a57265"
            "75736584c40b5f5f6e6461727261795f5fc3c40464617461c4020000c4056474797065a37c6231c40573686170659102"
        ),
    ),
    "feedback_message": (
        lambda: {
            "message_type": "feedback",
            "env_indices": np.array([3], dtype="<i8"),
            "step_ids": np.array([5], dtype="<i8"),
            "data": {
                "obs": {"images": {}, "states": {"t": np.array([[4.0]])}, "text": ["stack"]},
                "rewards": np.array([2.5], dtype="<f4"),
                "terminated": np.array([True]),
                "truncated": np.array([False]),
                "info": {
                    "episode": {
                        "r": np.array([4.0], dtype="<f4"),
                        "l": np.array([4]),
                        "s": np.array([True]),
                        "mask": np.array([True]),
                    }
                },
                "scalar": np.float32(0.5),
                "count": np.int64(7),
                "plain": np.float64(1.25),
            },
        },
        (
            "84ac6d6573736167655f74797065a8666565646261636bab656e765f696e646963657384c40b5f5f6e6461727261795f"
            "5fc3c40464617461c4080300000000000000c4056474797065a33c6938c40573686170659101a8737465705f69647384"
            "c40b5f5f6e6461727261795f5fc3c40464617461c4080500000000000000c4056474797065a33c6938c4057368617065"
            "9101a46461746188a36f627383a6696d6167657380a673746174657381a17484c40b5f5f6e6461727261795f5fc3c404"
            "64617461c4080000000000001040c4056474797065a33c6638c4057368617065920101a47465787491a5737461636ba7"
            "7265776172647384c40b5f5f6e6461727261795f5fc3c40464617461c40400002040c4056474797065a33c6634c40573"
            "686170659101aa7465726d696e6174656484c40b5f5f6e6461727261795f5fc3c40464617461c40101c4056474797065"
            "a37c6231c40573686170659101a97472756e636174656484c40b5f5f6e6461727261795f5fc3c40464617461c40100c4"
            "056474797065a37c6231c40573686170659101a4696e666f81a7657069736f646584a17284c40b5f5f6e646172726179"
            "5f5fc3c40464617461c40400008040c4056474797065a33c6634c40573686170659101a16c84c40b5f5f6e6461727261"
            "795f5fc3c40464617461c4080400000000000000c4056474797065a33c6938c40573686170659101a17384c40b5f5f6e"
            "6461727261795f5fc3c40464617461c40101c4056474797065a37c6231c40573686170659101a46d61736b84c40b5f5f"
            "6e6461727261795f5fc3c40464617461c40101c4056474797065a37c6231c40573686170659101a67363616c617283c4"
            "0d5f5f6e7067656e657269635f5fc3c40464617461cb3fe0000000000000c4056474797065a33c6634a5636f756e7483"
            "c40d5f5f6e7067656e657269635f5fc3c4046461746107c4056474797065a33c6938a5706c61696ecb3ff40000000000"
            "00"
        ),
    ),
}

# SHA-256 of openpi's bytes for values whose arrays take packb's large-array path (>= 64 KiB).
LARGE_GOLDEN: dict[str, tuple[Any, int, str]] = {
    "large_infer": (
        lambda: {
            "message_type": "infer",
            "data": {
                "images": {
                    "base": (np.arange(2 * 224 * 224 * 3) % 251).astype("|u1").reshape(2, 224, 224, 3),
                    "wrist": (np.arange(2 * 224 * 224 * 3) % 241).astype("|u1").reshape(2, 224, 224, 3)[:, ::-1],
                },
                "states": {"joints": np.linspace(-1.0, 1.0, 28).reshape(2, 14)},
                "text": np.array(["pick up the red block", "stack"]),
            },
            "env_indices": np.array([0, 1], dtype="<i8"),
            "step_ids": np.array([0, 0], dtype="<i8"),
        },
        602898,
        "aac743ef8d8e525004dac274a332a5e83cf8fbe5516e492598bc14cd54b2818a",
    ),
    "large_transposed_f4": (
        lambda: np.linspace(0.0, 1.0, 300 * 200, dtype="<f4").reshape(300, 200).T,
        240050,
        "2eebc38600ced72b2cfc75ae0c78e865044b3b084a736b02b10d24cc26dd852a",
    ),
    "large_big_endian_f8": (
        lambda: np.linspace(-5.0, 5.0, 20000).astype(">f8"),
        160048,
        "7bd548d886e60bef33c5ed8f2f4315a4d956b438d929d2e2070d080012da7b59",
    ),
    "large_fortran_i2": (
        lambda: np.asfortranarray((np.arange(400 * 300) % 30000).astype("<i2").reshape(400, 300)),
        240051,
        "635a0bac4c20c3636076dadb869080b73a8922fbd70c0e5fbacdc4af73c3dc54",
    ),
    "large_bool_b1": (
        lambda: np.arange(100000) % 3 == 0,
        100050,
        "eb29eddf9563353c71c1810ca0f918db0d5c7e3a882fc0422278af135890a1a6",
    ),
    "huge_text_U": (
        lambda: np.array(["x" * 5000] * 20),
        400049,
        "c3b1706d6c9cecb33659163631b02f6f4c87332bc0e5f4420b4b1a91eae4ae15",
    ),
}


def reference_default(obj: Any) -> Any:
    """docs/protocol.md "Arrays" spelled the straightforward way: ``tobytes()`` gives the C-order data."""
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot encode a {type(obj).__name__}")


def reference_packb(obj: Any) -> bytes:
    return msgpack.packb(obj, default=reference_default, use_bin_type=True)


def raw_frame(obj: Any) -> bytes:
    """A frame packed by plain msgpack, to put exactly what a test wants on the wire."""
    return msgpack.packb(obj, use_bin_type=True)


def ndarray_map(data: Any = b"\x00" * 8, dtype: Any = "<f8", shape: Any = (1,), **extra: Any) -> dict:
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape, **extra}


def after_round_trip(value: Any) -> Any:
    """What decoding should give back for ``value``: msgpack turns tuples into lists, and np.float64 and
    np.str_ (subclasses of float and str) travel as a plain float and str, exactly as openpi packs them."""
    if isinstance(value, dict):
        return {k: after_round_trip(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [after_round_trip(v) for v in value]
    if isinstance(value, np.float64):
        return float(value)
    if isinstance(value, np.str_):
        return str(value)
    return value


def assert_same(decoded: Any, expected: Any, where: str = "value") -> None:
    """Equal in type, dtype, shape and every bit (NaN payloads and -0.0 included)."""
    if isinstance(expected, np.ndarray):
        assert isinstance(decoded, np.ndarray), where
        assert decoded.dtype == expected.dtype and decoded.dtype.str == expected.dtype.str, where
        assert decoded.shape == expected.shape, where
        assert decoded.tobytes() == expected.tobytes(), where
        assert not decoded.flags.writeable, f"{where}: a decoded array must be read-only"
    elif isinstance(expected, dict):
        assert type(decoded) is dict and list(decoded) == list(expected), where
        for key in expected:
            assert_same(decoded[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, list):
        assert type(decoded) is list and len(decoded) == len(expected), where
        for i, (d, e) in enumerate(zip(decoded, expected)):
            assert_same(d, e, f"{where}[{i}]")
    else:
        assert type(decoded) is type(expected), f"{where}: {type(decoded).__name__} != {type(expected).__name__}"
        if isinstance(expected, np.generic):
            assert decoded.dtype.str == expected.dtype.str, where
        assert decoded == expected or (decoded != decoded and expected != expected), where


# ---------------------------------------------------------------- byte identity with openpi


def test_spec_text_example_is_u21_of_168_bytes_exactly_as_openpi_packs_it() -> None:
    value = np.array(["pick up the red block", "stack"])
    frame = codec.packb(value)
    fields = msgpack.unpackb(frame, raw=False)
    assert fields[b"__ndarray__"] is True
    assert fields[b"dtype"] == "<U21"
    assert fields[b"shape"] == [2]
    assert isinstance(fields[b"data"], bytes) and len(fields[b"data"]) == 168
    assert fields[b"data"][:8] == bytes([0x70, 0, 0, 0, 0x69, 0, 0, 0])  # "p", "i" in UTF-32-LE
    assert frame == bytes.fromhex(GOLDEN["text_spec"][1])


@pytest.mark.parametrize("join_min_bytes", [codec._JOIN_MIN_BYTES, 0], ids=["default-path", "join-every-array"])
@pytest.mark.parametrize("name", list(GOLDEN))
def test_packb_is_byte_identical_to_openpi(name: str, join_min_bytes: int) -> None:
    # With the threshold at 0, every array takes the large-array (join) path, so the golden vectors
    # check both ways the encoder writes an array.
    build, golden = GOLDEN[name]
    with mock.patch.object(codec, "_JOIN_MIN_BYTES", join_min_bytes):
        frame = codec.packb(build())
    assert type(frame) is bytes
    assert frame.hex() == golden


def library_packb(obj: Any) -> bytes:
    """msgpack's own path with the codec's array hook: what packb's copy-once walk must reproduce."""
    return msgpack.packb(obj, default=codec._encode_default, use_bin_type=True)


@pytest.mark.parametrize("name", list(GOLDEN))
def test_the_plain_msgpack_path_with_the_array_hook_writes_the_same_bytes_as_openpi(name: str) -> None:
    build, golden = GOLDEN[name]
    assert library_packb(build()).hex() == golden


@pytest.mark.parametrize("name", list(LARGE_GOLDEN))
def test_packb_of_large_arrays_is_byte_identical_to_openpi(name: str) -> None:
    build, size, sha256 = LARGE_GOLDEN[name]
    for frame in (codec.packb(build()), library_packb(build())):
        assert len(frame) == size
        assert hashlib.sha256(frame).hexdigest() == sha256


def test_np_float64_travels_as_a_plain_msgpack_float_like_openpi() -> None:
    # np.float64 subclasses float, so msgpack packs it natively before the default hook is asked.
    assert codec.packb(np.float64(2.5)) == bytes.fromhex("cb4004000000000000") == msgpack.packb(2.5)
    assert codec.packb(np.float32(1.5)) != msgpack.packb(1.5)  # float32 is an __npgeneric__ map


@pytest.mark.parametrize("nbytes", [0, 1, 255, 256, 65535, 65536, 65537, 300000])
@pytest.mark.parametrize("join_min_bytes", [codec._JOIN_MIN_BYTES, 0])
def test_packb_writes_msgpack_bin_headers_at_every_size_boundary(nbytes: int, join_min_bytes: int) -> None:
    value = {"a": [np.arange(nbytes, dtype="|u1"), (np.arange(nbytes % 7, dtype="<i8"),)]}
    with mock.patch.object(codec, "_JOIN_MIN_BYTES", join_min_bytes):
        assert codec.packb(value) == reference_packb(value)


def test_packb_matches_msgpack_for_subclassed_containers_ext_types_and_deep_nesting() -> None:
    point = collections.namedtuple("point", "x y")
    big = np.arange(70000, dtype="<u2")
    deep: Any = big
    for _ in range(40):  # deeper than packb walks: the rest is left to msgpack
        deep = [deep]
    value = {
        "ordered": collections.OrderedDict(b=big, a=1),
        "named": point(big, np.float32(2.0)),
        "ext": msgpack.ExtType(5, b"xyz"),
        "deep": deep,
        (1, 2): "tuple key",
        7: None,
        b"bin": True,
    }
    assert codec.packb(value) == reference_packb(value)


@pytest.mark.parametrize(
    "value",
    [
        msgpack.ExtType(5, b"xyz"),
        collections.OrderedDict(a=np.arange(70000, dtype="|u1")),
        collections.namedtuple("pair", "a b")(np.arange(70000, dtype="|u1"), 1),
    ],
    ids=["ext", "ordered-dict", "namedtuple"],
)
def test_packb_matches_msgpack_for_a_top_level_subclass_or_ext_type(value: Any) -> None:
    assert codec.packb(value) == reference_packb(value)


def test_packb_of_absurdly_deep_nesting_fails_like_msgpack_not_with_a_recursion_error() -> None:
    deep: Any = np.arange(3)
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ValueError, match="recursion limit"):
        reference_packb(deep)
    with pytest.raises(ValueError, match="recursion limit"):
        codec.packb(deep)


def test_a_masked_array_is_packed_through_its_own_tobytes_like_openpi() -> None:
    masked = np.ma.masked_array(np.arange(20000, dtype="<f8"), mask=[True] + [False] * 19999, fill_value=-1.0)
    assert codec.packb({"m": masked}) == reference_packb({"m": masked})


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", list(GOLDEN) + list(LARGE_GOLDEN))
def test_round_trip_gives_back_the_value_with_its_dtype_and_shape(name: str) -> None:
    build = GOLDEN[name][0] if name in GOLDEN else LARGE_GOLDEN[name][0]
    value = build()
    assert_same(codec.unpackb(codec.packb(value)), after_round_trip(value))


def test_decoded_arrays_are_read_only_views() -> None:
    decoded = codec.unpackb(codec.packb({"a": np.arange(6, dtype="<i4").reshape(2, 3)}))["a"]
    assert not decoded.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        decoded[0, 0] = 1


def test_non_contiguous_input_decodes_as_c_ordered_data() -> None:
    original = np.arange(12, dtype=">i8").reshape(3, 4)[::2, ::-1].T
    decoded = codec.unpackb(codec.packb(original))
    assert decoded.dtype.str == ">i8"
    assert decoded.flags.c_contiguous
    np.testing.assert_array_equal(decoded, original)


def test_big_endian_input_keeps_its_byte_order_on_the_wire() -> None:
    fields = msgpack.unpackb(codec.packb(np.array([1.5], dtype=">f4")))
    assert fields[b"dtype"] == ">f4"
    assert fields[b"data"] == bytes.fromhex("3fc00000")


def test_text_sent_as_a_list_of_str_decodes_as_that_list() -> None:
    assert codec.unpackb(codec.packb({"text": ["a", "bc"]})) == {"text": ["a", "bc"]}


# ---------------------------------------------------------------- encoder refusals


@pytest.mark.parametrize(
    "value",
    [
        np.array([None, 1], dtype=object),
        np.zeros(3, dtype=np.complex64),
        np.zeros(20000, dtype=np.complex128),  # large: the join path refuses it too
        np.zeros(40000, dtype=object),
        np.zeros(2, dtype=[("x", "<f4")]),
        np.complex64(1 + 2j),
        {1, 2},
    ],
    ids=["object", "complex", "large-complex", "large-object", "structured", "complex-scalar", "set"],
)
def test_encoding_what_the_protocol_cannot_carry_raises_type_error(value: Any) -> None:
    with pytest.raises(TypeError):
        codec.packb({"x": value})
    with pytest.raises(TypeError):
        library_packb({"x": value})


# ---------------------------------------------------------------- decoder validation


def assert_refused(frame: bytes, field: str, phrase: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        codec.unpackb(frame)
    assert caught.value.field == field, str(caught.value)
    assert phrase in str(caught.value), str(caught.value)
    return caught.value


@pytest.mark.parametrize(("typestr", "kind"), [("|O8", "O"), ("|V4", "V"), ("<c8", "c"), ("<c16", "c")])
def test_object_void_and_complex_kinds_are_refused(typestr: str, kind: str) -> None:
    data = b"\x00" * int(typestr[2:])
    assert_refused(raw_frame(ndarray_map(data, typestr, [1])), "dtype", f"kind {kind!r} is refused")


@pytest.mark.parametrize(
    ("typestr", "phrase"),
    [
        ("f4", "is not a typestr"),
        ("<f", "is not a typestr"),
        ("<f4x", "is not a typestr"),
        ("", "is not a typestr"),
        ("<f04", "is not a typestr"),
        ("<U0", "is not a typestr"),
        ("<4f", "is not a typestr"),
        (" <f4", "is not a typestr"),
        ("<f4\n", "is not a typestr"),
        (5, "must be a str typestr, got int"),
        (b"<f4", "must be a str typestr, got bytes"),
        (None, "must be a str typestr, got NoneType"),
        (["<f4"], "must be a str typestr, got list"),
        ("|f4", "byte order '|' is only for one-byte types"),
        ("|U3", "needs byte order < or >"),
        ("<b2", "item size 2 is not valid for kind 'b'"),
        ("<i3", "item size 3 is not valid for kind 'i'"),
        ("<f16", "item size 16 is not valid for kind 'f'"),
        ("<u16", "item size 16 is not valid for kind 'u'"),
        ("|S4", "kind 'S' is not one of b, u, i, f, U"),
        ("<M8", "kind 'M' is not one of b, u, i, f, U"),
    ],
)
def test_malformed_typestrs_are_refused(typestr: Any, phrase: str) -> None:
    assert_refused(raw_frame(ndarray_map(b"\x00" * 4, typestr, [1])), "dtype", phrase)
    with pytest.raises(ProtocolError, match="dtype"):
        codec.parse_typestr(typestr)


@pytest.mark.parametrize(
    "typestr",
    ["|b1", "<b1", "|u1", "<u2", ">u4", "<u8", "|i1", ">i2", "<i4", ">i8", "<f2", ">f4", "<f8", "<U1", ">U21"],
)
def test_every_typestr_the_protocol_uses_parses_to_that_dtype(typestr: str) -> None:
    assert codec.parse_typestr(typestr) == np.dtype(typestr)


@pytest.mark.parametrize(
    ("shape", "phrase"),
    [
        ([-1], "is not a list of non-negative ints"),
        ([2, -1], "is not a list of non-negative ints"),
        ([1.5], "is not a list of non-negative ints"),
        ([1.0], "is not a list of non-negative ints"),
        (["3"], "is not a list of non-negative ints"),
        ([True], "is not a list of non-negative ints"),
        ([None], "is not a list of non-negative ints"),
        ([[1]], "is not a list of non-negative ints"),
        ([1, [1]], "is not a list of non-negative ints"),
        (-1, "must be a list of non-negative ints, got int"),
        (1, "must be a list of non-negative ints, got int"),
        (1.5, "must be a list of non-negative ints, got float"),
        ("3", "must be a list of non-negative ints, got str"),
        (True, "must be a list of non-negative ints, got bool"),
        (None, "must be a list of non-negative ints, got NoneType"),
        ({"a": 1}, "must be a list of non-negative ints, got dict"),
        ([1] * 33, "has 33 dimensions, more than 32"),
        ([0, 2**62, 2**62], "is too large for numpy"),
        ([0, 2**64 - 1], "is too large for numpy"),
    ],
)
def test_shapes_that_are_not_lists_of_non_negative_ints_are_refused(shape: Any, phrase: str) -> None:
    data = b"" if isinstance(shape, list) and 0 in shape else b"\x00" * 8
    assert_refused(raw_frame(ndarray_map(data, "<f8", shape)), "shape", phrase)


@pytest.mark.parametrize(
    ("data", "typestr", "shape", "phrase"),
    [
        (b"\x00" * 7, "<f8", [1], "holds 7 bytes, but shape [1] of <f8 needs 8"),
        (b"\x00" * 9, "<f8", [1], "holds 9 bytes, but shape [1] of <f8 needs 8"),
        (b"\x00" * 8, "<f4", [3], "holds 8 bytes, but shape [3] of <f4 needs 12"),
        (b"", "<f4", [], "holds 0 bytes, but shape [] of <f4 needs 4"),
        (b"\x00", "<f4", [2, 0], "holds 1 bytes, but shape [2, 0] of <f4 needs 0"),
        (b"\x00" * 167, "<U21", [2], "holds 167 bytes, but shape [2] of <U21 needs 168"),
    ],
)
def test_data_whose_length_is_not_prod_shape_times_itemsize_is_refused(
    data: bytes, typestr: str, shape: list, phrase: str
) -> None:
    assert_refused(raw_frame(ndarray_map(data, typestr, shape)), "data", phrase)


def test_a_zero_d_array_holds_exactly_one_item() -> None:
    decoded = codec.unpackb(raw_frame(ndarray_map(b"\x00\x00\xc0\x3f", "<f4", [])))
    assert decoded.shape == () and decoded.dtype.str == "<f4" and decoded == np.float32(1.5)


def test_an_absurd_shape_is_refused_quickly_and_without_allocating() -> None:
    frame = raw_frame(ndarray_map(b"\x00" * 8, "<f8", [2**40]))
    tracemalloc.start()
    try:
        assert_refused(frame, "data", "holds 8 bytes, but shape [1099511627776] of <f8 needs 8796093022208")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"refusing allocated {peak} bytes"


@pytest.mark.parametrize("data", ["\x00" * 8, 8, None, [0] * 8], ids=["str", "int", "nil", "array"])
def test_data_that_is_not_msgpack_bin_is_refused(data: Any) -> None:
    assert_refused(raw_frame(ndarray_map(data, "<f8", [1])), "data", "must be msgpack bin")


@pytest.mark.parametrize("missing", [b"data", b"dtype", b"shape"])
def test_an_ndarray_map_missing_a_field_is_refused_naming_it(missing: bytes) -> None:
    fields = ndarray_map()
    del fields[missing]
    assert_refused(raw_frame(fields), missing.decode(), "is missing")


def test_ndarray_fields_with_str_keys_are_not_taken_for_an_array() -> None:
    # The convention's keys are bin; a map with str keys is just a map.
    assert codec.unpackb(raw_frame({"__ndarray__": True, "data": b"x"})) == {"__ndarray__": True, "data": b"x"}


@pytest.mark.parametrize(
    "frame",
    [b"", b"\xc1", b"\x01\x02", b"\x81", b"\xc4\x05ab", b"\xdf\xff\xff\xff\xff", b"\xa1\xff", b"\xd5\xff\x00\x00"],
    ids=["empty", "reserved-byte", "extra-data", "map-without-entries", "short-bin", "huge-map", "bad-utf8", "bad-ts"],
)
def test_garbage_msgpack_is_a_protocol_error(frame: bytes) -> None:
    assert_refused(frame, "frame", "is not valid msgpack")


def test_a_map_keyed_by_a_map_is_a_protocol_error() -> None:
    assert_refused(b"\x81\x80\xc0", "frame", "unhashable")


def test_every_truncation_of_a_valid_frame_is_a_protocol_error() -> None:
    frame = bytes.fromhex(GOLDEN["infer_message"][1])
    for cut in range(len(frame)):
        with pytest.raises(ProtocolError):
            codec.unpackb(frame[:cut])


@pytest.mark.parametrize("opener", [b"\x81\xa1k", b"\x91"], ids=["maps", "arrays"])
def test_deep_nesting_is_a_protocol_error_not_a_crash(opener: bytes) -> None:
    frame = opener * 100_000 + b"\xc0"
    assert_refused(frame, "frame", "nests too deeply")


@pytest.mark.parametrize(
    ("typestr", "data", "phrase"),
    [
        ("<f4", "1.5", "a <f4 scalar cannot hold a str"),
        ("<f4", None, "a <f4 scalar cannot hold a NoneType"),
        ("<f4", b"\x00\x00\xc0\x3f", "a <f4 scalar cannot hold a bytes"),
        ("<f4", True, "a <f4 scalar cannot hold a bool"),
        ("|b1", 1, "a |b1 scalar cannot hold a int"),
        ("|b1", "true", "a |b1 scalar cannot hold a str"),
        ("<i8", 1.5, "a <i8 scalar cannot hold a float"),
        ("<i8", True, "a <i8 scalar cannot hold a bool"),
        ("|u1", 256, "256 does not fit |u1"),
        ("|u1", -1, "-1 does not fit |u1"),
        ("|i1", 128, "128 does not fit |i1"),
        ("<u8", -1, "-1 does not fit <u8"),
        ("<f4", 1e300, "1e+300 does not fit <f4: it overflows to inf"),
        ("<f2", 70000.0, "70000.0 does not fit <f2: it overflows to inf"),
        ("<U2", "abc", "has more than the 2 characters of <U2"),
        ("<U2", 5, "a <U2 scalar cannot hold a int"),
    ],
)
def test_an_npgeneric_whose_data_does_not_fit_its_dtype_is_refused(typestr: str, data: Any, phrase: str) -> None:
    assert_refused(raw_frame({b"__npgeneric__": True, b"data": data, b"dtype": typestr}), "data", phrase)


@pytest.mark.parametrize(
    ("typestr", "data", "expected"),
    [
        ("<f4", 1.5, np.float32(1.5)),
        ("<f4", 2, np.float32(2.0)),  # an integral float packed as an int (as a JavaScript peer does)
        ("<f8", math.inf, np.float64(math.inf)),
        ("<i8", -(2**63), np.int64(-(2**63))),
        ("<u8", 2**64 - 1, np.uint64(2**64 - 1)),
        ("|b1", False, np.bool_(False)),
        ("<U3", "ab", np.str_("ab")),
    ],
)
def test_an_npgeneric_that_fits_its_dtype_decodes_to_that_numpy_scalar(typestr: str, data: Any, expected: Any) -> None:
    decoded = codec.unpackb(raw_frame({b"__npgeneric__": True, b"data": data, b"dtype": typestr}))
    assert type(decoded) is type(expected) and decoded == expected


# ---------------------------------------------------------------- property tests

_NUMERIC_TYPESTRS = "|b1 |u1 <u2 >u2 <u4 >u4 <u8 >u8 |i1 <i2 >i2 <i4 >i4 <i8 >i8 <f2 >f2 <f4 >f4 <f8 >f8".split()
_NUMERIC_DTYPES = [np.dtype(t) for t in _NUMERIC_TYPESTRS]
_DTYPES = st.one_of(st.sampled_from(_NUMERIC_DTYPES), hnp.unicode_string_dtypes(endianness="?", min_len=1, max_len=8))
_LAYOUTS = st.sampled_from(["c", "fortran", "transposed", "strided"])


def _lay_out(array: np.ndarray, layout: str) -> np.ndarray:
    if layout == "fortran":
        return np.asfortranarray(array)
    if layout == "transposed":
        return array.T
    if layout == "strided" and array.ndim:
        return array[::2]
    return array


@FUZZ
@given(
    array=hnp.arrays(_DTYPES, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)),
    layout=_LAYOUTS,
    join_every_array=st.booleans(),
)
def test_property_arrays_round_trip_bit_exactly_and_pack_like_the_reference(
    array: np.ndarray, layout: str, join_every_array: bool
) -> None:
    array = _lay_out(array, layout)
    message = {"a": array, "nested": [array, {"again": (array,)}]}
    with mock.patch.object(codec, "_JOIN_MIN_BYTES", 0 if join_every_array else codec._JOIN_MIN_BYTES):
        frame = codec.packb(message)
    assert frame == reference_packb(message)
    assert_same(codec.unpackb(frame), after_round_trip(message))


def decode_or_refuse(frame: bytes) -> None:
    """Decoding may return anything or raise ProtocolError; any other exception fails the test."""
    try:
        codec.unpackb(frame)
    except ProtocolError:
        pass


@FUZZ
@given(frame=st.binary(max_size=512))
def test_property_arbitrary_bytes_decode_or_raise_protocol_error_only(frame: bytes) -> None:
    decode_or_refuse(frame)


@FUZZ
@given(
    name=st.sampled_from(list(GOLDEN)),
    edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(min_value=0),
)
def test_property_corrupted_valid_frames_decode_or_raise_protocol_error_only(
    name: str, edits: list[tuple[int, int]], cut: int
) -> None:
    frame = bytearray.fromhex(GOLDEN[name][1])
    for position, byte in edits:
        frame[position % len(frame)] = byte
    decode_or_refuse(bytes(frame[: len(frame) - cut % 4]))


_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=48),
)
_TYPESTRS = st.one_of(
    st.sampled_from(["|b1", "|u1", "<u2", ">u8", "|i1", "<i4", ">i8", "<f2", "<f4", ">f8", "<U1", ">U5"]),
    st.sampled_from(["|O8", "|V4", "<c8", "<M8", "|S2", "<U0", "|U2", "<f3", "<b2", "f4", ""]),
    st.from_regex(r"[<>|=][a-zA-Z][0-9]{0,3}", fullmatch=True),
    _LEAVES,
)
_DIMS = st.one_of(st.integers(min_value=0, max_value=4), st.integers(min_value=-(2**63), max_value=2**64 - 1))
_SHAPES = st.one_of(
    st.lists(_DIMS, max_size=5),
    st.lists(st.one_of(_DIMS, _LEAVES), max_size=40),
    _LEAVES,
)


@st.composite
def _ndarray_maps(draw: st.DrawFn) -> dict:
    """Mostly well-formed ndarray maps (so the decoder gets past its first checks), each field
    possibly replaced by something arbitrary or left out."""
    fields: dict = {b"__ndarray__": draw(st.one_of(st.just(True), _LEAVES))}
    typestr = draw(_TYPESTRS)
    shape = draw(_SHAPES)
    data = b""
    if type(typestr) is str and isinstance(shape, list) and all(type(dim) is int for dim in shape):
        try:
            itemsize = codec.parse_typestr(typestr).itemsize
        except ProtocolError:
            itemsize = 1
        size = math.prod(shape) * itemsize
        data = bytes(size) if 0 <= size <= 4096 else b""
    data = draw(st.one_of(st.just(data), st.binary(max_size=64), _LEAVES))
    for key, value in ((b"dtype", typestr), (b"shape", shape), (b"data", data)):
        if draw(st.integers(0, 9)):
            fields[key] = value
    return fields


_NPGENERIC_MAPS = st.fixed_dictionaries(
    {b"__npgeneric__": st.just(True)}, optional={b"data": _LEAVES, b"dtype": _TYPESTRS}
)
_MESSAGES = st.recursive(
    st.one_of(_LEAVES, _ndarray_maps(), _NPGENERIC_MAPS),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=4), st.binary(max_size=4), _DIMS), children, max_size=4),
    ),
    max_leaves=12,
)


@FUZZ
@given(message=_MESSAGES)
def test_property_arbitrary_msgpack_maps_decode_or_raise_protocol_error_only(message: Any) -> None:
    decode_or_refuse(raw_frame(message))


@pytest.mark.parametrize("shape", [(2, 3), (224, 224, 3), (480, 640, 3)])
@pytest.mark.parametrize("n", [1, 4])
def test_stacked_rows_pack_to_the_bytes_of_the_stacked_array(shape: tuple[int, ...], n: int) -> None:
    rng = np.random.default_rng(n)
    rows = [rng.integers(0, 255, shape, dtype=np.uint8) for _ in range(n)]
    rows[0] = rows[0][:, ::-1] if len(shape) > 1 else rows[0]  # a non-contiguous row too
    message = {"images": {"cam": codec.StackedRows(rows, np.dtype(np.uint8))}, "x": 1}
    expected = library_packb({"images": {"cam": np.stack(rows)}, "x": 1})
    assert codec.packb(message) == expected
    decoded = codec.unpackb(codec.packb(message))["images"]["cam"]
    assert np.array_equal(decoded, np.stack(rows))
