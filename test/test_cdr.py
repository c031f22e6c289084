"""plugrl_ros.ros.cdr against rclpy's own serializer: serialized Image / CompressedImage / JointState read in place.

The parser is a safety boundary (the bytes come from another process), so
besides agreeing with rclpy on every message rclpy writes, it must never
raise or read past the buffer on bytes rclpy did not write, and whatever it
does accept, rclpy must read the same way.
"""

from __future__ import annotations

import struct
from typing import Any

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import CompressedImage, Image, JointState

from plugrl_ros.params.section import Section
from plugrl_ros.ros.cdr import parse_compressed_image, parse_image, parse_joint_state
from plugrl_ros.ros.images import ENCODINGS, CompressedImageSource, RawImageSource
from plugrl_ros.ros.sources import ConversionError, JointStateSource

pytestmark = [pytest.mark.ros]

PROPERTY = settings(
    max_examples=150,
    deadline=None,  # two shared cores: a slow example is not a failure
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
U32 = st.integers(0, 2**32 - 1)
# strings as ROS carries them: UTF-8, no NUL (a C string ends there); empty and long ones
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40) | st.sampled_from(
    ["", "f" * 257, "cämera/ß"]
)
ENCODING = st.sampled_from(sorted(ENCODINGS)) | TEXT


@st.composite
def images(draw: Any) -> Image:
    msg = Image(
        height=draw(st.integers(0, 9) | U32),
        width=draw(st.integers(0, 17) | U32),
        encoding=draw(ENCODING),
        is_bigendian=draw(st.integers(0, 255)),
        step=draw(st.integers(0, 64) | U32),
    )
    msg.header.frame_id = draw(TEXT)
    msg.header.stamp.sec = draw(st.integers(-(2**31), 2**31 - 1))
    msg.header.stamp.nanosec = draw(U32)
    msg.data = draw(st.binary(max_size=600))
    return msg


@st.composite
def compressed_images(draw: Any) -> CompressedImage:
    msg = CompressedImage(format=draw(st.sampled_from(["jpeg", "png", "rgb8; jpeg compressed bgr8"]) | TEXT))
    msg.header.frame_id = draw(TEXT)
    msg.header.stamp.sec = draw(st.integers(-(2**31), 2**31 - 1))
    msg.data = draw(st.binary(max_size=600))
    return msg


@st.composite
def consistent_images(draw: Any) -> Image:
    """Images a camera could send: every supported encoding, odd widths, padded steps, either byte order."""
    encoding = draw(st.sampled_from(sorted(ENCODINGS)))
    enc = ENCODINGS[encoding]
    height, width, pad = draw(st.integers(1, 9)), draw(st.integers(1, 17)), draw(st.integers(0, 7))
    step = width * enc.channels * np.dtype(enc.dtype).itemsize + pad
    msg = Image(height=height, width=width, encoding=encoding, is_bigendian=draw(st.integers(0, 1)), step=step)
    msg.header.frame_id = draw(TEXT)
    msg.data = draw(st.binary(min_size=step * height, max_size=step * height))
    return msg


def cdr(order: str, fields: list[tuple[str, Any]], pad: int = 0xAB) -> bytes:
    """Plain CDR written from the layout's description, in either byte order (the test's own writer)."""
    out = bytearray(b"\x00\x01\x00\x00" if order == "<" else b"\x00\x00\x00\x00")

    def align() -> None:
        while (len(out) - 4) % 4:
            out.append(pad)  # padding is junk: nobody may read it

    for kind, value in fields:
        if kind == "u8":
            out.append(value)
            continue
        align()
        if kind == "i32":
            out += struct.pack(order + "i", value)
        elif kind == "u32":
            out += struct.pack(order + "I", value)
        elif kind == "string":
            text = value.encode() + b"\x00"
            out += struct.pack(order + "I", len(text)) + text
        elif kind == "strings":
            out += struct.pack(order + "I", len(value))
            for item in value:
                align()
                text = item.encode() + b"\x00"
                out += struct.pack(order + "I", len(text)) + text
        elif kind == "f64s":
            out += struct.pack(order + "I", len(value))
            if len(value):
                while (len(out) - 4) % 8:
                    out.append(pad)
            out += struct.pack(f"{order}{len(value)}d", *value)
        else:
            assert kind == "bytes"
            out += struct.pack(order + "I", len(value)) + bytes(value)
    return bytes(out)


def image_fields(msg: Image) -> list[tuple[str, Any]]:
    stamp = msg.header.stamp
    return [
        ("i32", stamp.sec),
        ("u32", stamp.nanosec),
        ("string", msg.header.frame_id),
        ("u32", msg.height),
        ("u32", msg.width),
        ("string", msg.encoding),
        ("u8", msg.is_bigendian),
        ("u32", msg.step),
        ("bytes", msg.data),
    ]


def compressed_fields(msg: CompressedImage) -> list[tuple[str, Any]]:
    stamp = msg.header.stamp
    return [
        ("i32", stamp.sec),
        ("u32", stamp.nanosec),
        ("string", msg.header.frame_id),
        ("string", msg.format),
        ("bytes", msg.data),
    ]


def assert_same_image(view: Any, msg: Image) -> None:
    assert view is not None
    assert (view.height, view.width, view.encoding, view.is_bigendian, view.step) == (
        msg.height,
        msg.width,
        msg.encoding,
        msg.is_bigendian,
        msg.step,
    )
    assert bytes(view.data) == bytes(msg.data)


def assert_same_compressed(view: Any, msg: CompressedImage) -> None:
    assert view is not None
    assert view.format == msg.format
    assert bytes(view.data) == bytes(msg.data)


# --- what rclpy writes -----------------------------------------------------------------


@PROPERTY
@given(images())
def test_every_image_rclpy_serializes_is_parsed_as_rclpy_reads_it(msg: Image) -> None:
    serialized = serialize_message(msg)
    view = parse_image(serialized)
    assert_same_image(view, msg)
    assert_same_image(view, deserialize_message(serialized, Image))
    # the pixels are the serialized bytes themselves, not a copy
    assert view.data.obj is serialized


@PROPERTY
@given(compressed_images())
def test_every_compressed_image_rclpy_serializes_is_parsed_as_rclpy_reads_it(msg: CompressedImage) -> None:
    serialized = serialize_message(msg)
    view = parse_compressed_image(serialized)
    assert_same_compressed(view, msg)
    assert view.data.obj is serialized


@PROPERTY
@given(images(), st.sampled_from("<>"))
def test_both_byte_orders_of_the_encapsulation_parse_as_rclpy_reads_them(msg: Image, order: str) -> None:
    serialized = cdr(order, image_fields(msg))
    assert_same_image(deserialize_message(serialized, Image), msg)  # the test's writer, checked by rclpy
    assert_same_image(parse_image(serialized), msg)


@PROPERTY
@given(compressed_images(), st.sampled_from("<>"))
def test_both_byte_orders_of_a_compressed_image_parse_as_rclpy_reads_them(msg: CompressedImage, order: str) -> None:
    serialized = cdr(order, compressed_fields(msg))
    assert_same_compressed(deserialize_message(serialized, CompressedImage), msg)
    assert_same_compressed(parse_compressed_image(serialized), msg)


# --- what rclpy did not write ------------------------------------------------------------


def rclpy_reads(serialized: bytes, msg_type: type) -> Any:
    try:
        return deserialize_message(serialized, msg_type)
    except RuntimeError:
        return None


@PROPERTY
@given(images(), st.data())
def test_a_truncated_or_extended_image_is_never_parsed_past_its_bytes(msg: Image, data: Any) -> None:
    serialized = serialize_message(msg)
    cut = data.draw(st.integers(0, len(serialized) - 1))
    assert parse_image(serialized[:cut]) is None
    # an rmw may pad the message to a multiple of 4; more than that is not this layout
    tail = data.draw(st.binary(min_size=1, max_size=12))
    view = parse_image(serialized + tail)
    if len(tail) <= 3:
        assert_same_image(view, msg)
    else:
        assert view is None


@PROPERTY
@given(st.one_of(images(), compressed_images()), st.data())
def test_corrupted_bytes_are_refused_or_read_as_rclpy_reads_them(msg: Any, data: Any) -> None:
    serialized = bytearray(serialize_message(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(0, len(serialized) - 1))
        serialized[where] = data.draw(st.integers(0, 255))
    serialized = bytes(serialized)
    if isinstance(msg, Image):
        view = parse_image(serialized)
        if view is not None:
            assert 0 <= view.data.nbytes <= len(serialized)
            assert_same_image(view, rclpy_reads(serialized, Image))
    else:
        view = parse_compressed_image(serialized)
        if view is not None:
            assert_same_compressed(view, rclpy_reads(serialized, CompressedImage))


@given(st.binary(max_size=200))
@PROPERTY
def test_arbitrary_bytes_never_raise(serialized: bytes) -> None:
    for parse, msg_type in ((parse_image, Image), (parse_compressed_image, CompressedImage)):
        view = parse(serialized)
        if view is not None:
            reference = rclpy_reads(serialized, msg_type)
            assert reference is not None
            (assert_same_image if msg_type is Image else assert_same_compressed)(view, reference)


@pytest.mark.parametrize(
    "encapsulation",
    [b"\x00\x02\x00\x00", b"\x00\x03\x00\x00", b"\x00\x07\x00\x00", b"\x01\x01\x00\x00", b"\x00\x01\x00\x01"],
)
def test_other_encapsulations_and_options_are_left_to_rclpy(encapsulation: bytes) -> None:
    serialized = encapsulation + serialize_message(Image(height=1, width=1, encoding="mono8", step=1))[4:]
    assert parse_image(serialized) is None
    assert parse_compressed_image(serialized) is None


def test_a_string_with_a_nul_inside_is_left_to_rclpy() -> None:
    # rclpy's string ends at the first NUL ("rgb8"); the parser must not read a different encoding
    msg = Image(height=1, width=1, encoding="rgb8", step=3)
    msg.data = b"\x01\x02\x03"
    fields = [(kind, "rgb8\x00mono8" if value == "rgb8" else value) for kind, value in image_fields(msg)]
    serialized = cdr("<", fields)
    assert parse_image(serialized) is None
    assert rclpy_reads(serialized, Image).encoding == "rgb8"
    np.testing.assert_array_equal(raw_source().convert(serialized), np.array([[[1, 2, 3]]], dtype=np.uint8))


# --- the sources: serialized in, the same picture (or the same error) out -------------------


def raw_source(**values: Any) -> RawImageSource:
    return RawImageSource(Section(values, "observations.images.cam"))


def outcome(source: Any, msg: Any) -> tuple[str, Any]:
    try:
        return "image", source.convert(msg)
    except ConversionError as exc:
        return "error", str(exc)


@PROPERTY
@given(
    consistent_images() | images(), st.sampled_from([{}, {"channels": 1}, {"resize": [3, 5]}, {"crop": [0, 1, 1, 2]}])
)
def test_a_serialized_image_converts_to_what_its_typed_message_does(msg: Image, config: dict) -> None:
    source = raw_source(**config)
    serialized = serialize_message(msg)
    typed_kind, typed = outcome(source, msg)
    kind, converted = outcome(source, serialized)
    assert kind == typed_kind
    if kind == "image":
        np.testing.assert_array_equal(converted, typed)
        assert not converted.flags.writeable or not np.may_share_memory(converted, np.frombuffer(serialized, np.uint8))
    else:
        assert converted == typed


def test_a_serialized_image_without_conversion_is_a_read_only_view_of_the_message() -> None:
    pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    msg = Image(height=2, width=3, encoding="rgb8", step=9)
    msg.data = pixels.tobytes()
    serialized = serialize_message(msg)
    img = raw_source().convert(serialized)
    np.testing.assert_array_equal(img, pixels)
    assert np.may_share_memory(img, np.frombuffer(serialized, np.uint8))
    assert not img.flags.writeable


def test_a_serialized_compressed_image_decodes_like_its_typed_message() -> None:
    rng = np.random.default_rng(3)
    ok, encoded = cv2.imencode(".png", rng.integers(0, 256, size=(6, 9, 3), dtype=np.uint8))
    assert ok
    msg = CompressedImage(format="png")
    msg.data = encoded.tobytes()
    source = CompressedImageSource(Section({}, "observations.images.cam"))
    np.testing.assert_array_equal(source.convert(serialize_message(msg)), source.convert(msg))


def test_bytes_neither_parser_nor_rclpy_can_read_are_a_conversion_error() -> None:
    with pytest.raises(ConversionError, match="serialized Image message \\(6 bytes\\) is malformed"):
        raw_source().convert(b"\x00\x01\x00\x00\xff\xff")
    source = CompressedImageSource(Section({}, "observations.images.cam"))
    with pytest.raises(ConversionError, match="serialized CompressedImage message \\(3 bytes\\) is malformed"):
        source.convert(b"\x00\x01\x00")


def test_an_encapsulation_the_parser_leaves_is_converted_through_rclpy() -> None:
    # 00 03 (PL_CDR_LE) is not the plain layout: the parser steps aside, rclpy's Fast CDR reads it as little endian
    msg = Image(height=1, width=2, encoding="mono8", step=2)
    msg.data = b"\x05\x06"
    serialized = b"\x00\x03" + serialize_message(msg)[2:]
    assert parse_image(serialized) is None
    np.testing.assert_array_equal(raw_source(channels=1).convert(serialized), np.array([[[5], [6]]], dtype=np.uint8))


# --- sensor_msgs/JointState ----------------------------------------------------------------

FLOATS = st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, 1e-300, 1.5, -2.25])
NAMES = st.lists(st.sampled_from([f"joint_{i}" for i in range(6)]) | TEXT, max_size=8)


@st.composite
def joint_states(draw: Any) -> JointState:
    msg = JointState(name=draw(NAMES))
    for field in ("position", "velocity", "effort"):
        # drivers send all, some, or none of the three arrays, of any length
        setattr(msg, field, draw(st.lists(FLOATS, max_size=9)))
    msg.header.frame_id = draw(TEXT)
    msg.header.stamp.sec = draw(st.integers(-(2**31), 2**31 - 1))
    msg.header.stamp.nanosec = draw(U32)
    return msg


def joint_state_fields(msg: JointState) -> list[tuple[str, Any]]:
    stamp = msg.header.stamp
    return [
        ("i32", stamp.sec),
        ("u32", stamp.nanosec),
        ("string", msg.header.frame_id),
        ("strings", list(msg.name)),
        ("f64s", list(msg.position)),
        ("f64s", list(msg.velocity)),
        ("f64s", list(msg.effort)),
    ]


def assert_same_joint_state(view: Any, msg: JointState) -> None:
    assert view is not None
    assert (view.names() if hasattr(view, "names") else tuple(view.name)) == tuple(msg.name)
    for field in ("position", "velocity", "effort"):
        np.testing.assert_array_equal(getattr(view, field), np.asarray(getattr(msg, field), dtype=np.float64))


@PROPERTY
@given(joint_states())
def test_every_joint_state_rclpy_serializes_is_parsed_as_rclpy_reads_it(msg: JointState) -> None:
    serialized = serialize_message(msg)
    view = parse_joint_state(serialized)
    assert_same_joint_state(view, msg)
    assert_same_joint_state(view, deserialize_message(serialized, JointState))
    assert view.position.base is not None and not view.position.flags.writeable  # a view of the bytes


@PROPERTY
@given(joint_states(), st.sampled_from("<>"))
def test_both_byte_orders_of_a_joint_state_parse_as_rclpy_reads_them(msg: JointState, order: str) -> None:
    serialized = cdr(order, joint_state_fields(msg))
    assert_same_joint_state(deserialize_message(serialized, JointState), msg)  # the test's writer, checked
    assert_same_joint_state(parse_joint_state(serialized), msg)


@PROPERTY
@given(joint_states(), st.data())
def test_a_truncated_or_extended_joint_state_is_never_parsed_past_its_bytes(msg: JointState, data: Any) -> None:
    serialized = serialize_message(msg)
    cut = data.draw(st.integers(0, len(serialized) - 1))
    view = parse_joint_state(serialized[:cut])
    if view is not None:  # a cut in the last array's padding-free tail cannot be told apart only if rclpy agrees
        assert_same_joint_state(view, rclpy_reads(serialized[:cut], JointState))
    # rclpy's writer leaves up to 12 bytes after the last array (room reserved for alignment); rclpy
    # ignores what follows the last field, so a parse of a longer message must still read the same
    tail = data.draw(st.binary(min_size=1, max_size=48))
    view = parse_joint_state(serialized + tail)
    if len(tail) <= 3:
        assert_same_joint_state(view, msg)
    elif len(tail) > 36:
        assert view is None
    elif view is not None:
        assert_same_joint_state(view, msg)


@PROPERTY
@given(joint_states(), st.data())
def test_corrupted_joint_states_are_refused_or_read_as_rclpy_reads_them(msg: JointState, data: Any) -> None:
    serialized = bytearray(serialize_message(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(0, len(serialized) - 1))
        serialized[where] = data.draw(st.integers(0, 255))
    serialized = bytes(serialized)
    view = parse_joint_state(serialized)
    if view is not None:
        reference = rclpy_reads(serialized, JointState)
        assert reference is not None
        names = view.names()
        if names is not None:  # else the source hands the bytes to rclpy
            assert_same_joint_state(view, reference)


@given(st.binary(max_size=200))
@PROPERTY
def test_arbitrary_bytes_never_make_a_joint_state(serialized: bytes) -> None:
    view = parse_joint_state(serialized)
    if view is not None and view.names() is not None:
        assert_same_joint_state(view, rclpy_reads(serialized, JointState))


@PROPERTY
@given(joint_states(), joint_states(), st.sampled_from("<>"), st.sampled_from("<>"), st.data())
def test_a_previous_messages_view_never_changes_what_a_joint_state_parses_to(
    first: JointState, second: JointState, first_order: str, second_order: str, data: Any
) -> None:
    if data.draw(st.booleans()):
        second.name = list(first.name)  # the common case: the same names again (the fast path)
    pad = data.draw(st.integers(0, 255))
    previous = parse_joint_state(cdr(first_order, joint_state_fields(first)))
    serialized = cdr(second_order, joint_state_fields(second), pad)
    view = parse_joint_state(serialized, previous)
    assert_same_joint_state(view, second)
    assert view.name_key == parse_joint_state(serialized).name_key


def test_names_with_other_padding_bytes_are_the_same_names_to_the_source() -> None:
    # writers may leave the padding between strings uninitialised: it must not make the names look new
    source = JointStateSource(Section({"joints": ["b", "ab"]}, "observations.states.arm"))
    msg = JointState(name=["ab", "b", "c"], position=[1.0, 2.0, 3.0])
    for pad in (0x00, 0xAB, 0x5C, 0xFF):
        np.testing.assert_array_equal(source.convert(cdr("<", joint_state_fields(msg), pad)), [2.0, 1.0])
    assert len(source._view_indices) == 1


@PROPERTY
@given(st.permutations([f"j{i}" for i in range(5)]), st.lists(FLOATS, min_size=15, max_size=15), st.data())
def test_the_joint_state_source_reads_serialized_messages_exactly_as_typed_ones(
    order: list[str], values: list[float], data: Any
) -> None:
    source = JointStateSource(
        Section({"joints": ["j3", "j0", "j4"], "fields": ["effort", "position"]}, "observations.states.arm")
    )
    for _ in range(3):  # the driver may change its joint order between messages: the cached indices follow
        order = data.draw(st.permutations(order))
        msg = JointState(name=order, position=values[:5], velocity=values[5:10], effort=values[10:])
        serialized = serialize_message(msg)
        expected = source.convert(msg)
        np.testing.assert_array_equal(source.convert(serialized), expected)
        np.testing.assert_array_equal(source.convert(serialized), expected)  # the cached names
        where = {name: i for i, name in enumerate(order)}
        assert list(expected) == [values[10 + where[j]] for j in ("j3", "j0", "j4")] + [
            values[where[j]] for j in ("j3", "j0", "j4")
        ]


def test_a_serialized_joint_state_missing_a_joint_or_values_names_what_is_wrong() -> None:
    source = JointStateSource(Section({"joints": ["a", "b"], "fields": ["velocity"]}, "observations.states.arm"))
    with pytest.raises(ConversionError, match="joint 'b' is not in the JointState"):
        source.convert(serialize_message(JointState(name=["a"], velocity=[1.0])))
    with pytest.raises(ConversionError, match="has 0 velocity values for 2 joint names"):
        source.convert(serialize_message(JointState(name=["a", "b"], position=[1.0, 2.0])))
    with pytest.raises(ConversionError, match="malformed"):
        source.convert(b"\x00\x01\x00\x00\x01")
