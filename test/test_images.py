"""Tests for plugrl_ros.ros.images: Image and CompressedImage messages to uint8 [h, w, c] pictures."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from sensor_msgs.msg import CompressedImage, Image

from plugrl_ros.params.section import ConfigError, Section
from plugrl_ros.ros.images import ENCODINGS, IMAGE_SOURCES, make_image_source
from plugrl_ros.ros.sources import ConversionError

pytestmark = [pytest.mark.ros]

PREFIX = "observations.images.wrist"
RNG = np.random.default_rng(7)
# Odd sizes catch row/column mix-ups and any hidden alignment assumption.
PICTURE = RNG.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)


def source(type_name: str = "sensor_msgs/Image", **values):
    sec = Section(values, PREFIX)
    src = make_image_source(type_name, sec)
    sec.finish()
    return src


def image(pixels: np.ndarray, encoding: str, pad: int = 0, bigendian: bool = False) -> Image:
    """An Image message holding ``pixels`` ([h, w] or [h, w, c]) with ``pad`` junk bytes after each row."""
    height, width = pixels.shape[:2]
    rows = pixels.reshape(height, -1).view(np.uint8)
    if pad:
        rows = np.concatenate([rows, np.full((height, pad), 0xEE, dtype=np.uint8)], axis=1)
    msg = Image(height=height, width=width, encoding=encoding, is_bigendian=int(bigendian), step=rows.shape[1])
    msg.data = rows.tobytes()
    return msg


def compressed(pixels_bgr: np.ndarray, ext: str, fmt: str) -> CompressedImage:
    ok, encoded = cv2.imencode(ext, pixels_bgr)
    assert ok
    msg = CompressedImage(format=fmt)
    msg.data = encoded.tobytes()
    return msg


def luma(rgb: np.ndarray) -> np.ndarray:
    """ITU-R BT.601 luma, computed in float (OpenCV uses fixed point, so allow 1 of difference)."""
    return rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def check_output(img: np.ndarray, shape: tuple[int, ...]) -> None:
    assert img.dtype == np.uint8
    assert img.shape == shape
    assert img.flags.c_contiguous


# --- registry and configuration ------------------------------------------------------


def test_registry_holds_image_and_compressed_image():
    assert IMAGE_SOURCES["sensor_msgs/Image"].msg_type is Image
    assert IMAGE_SOURCES["sensor_msgs/CompressedImage"].msg_type is CompressedImage


def test_unknown_image_type_is_a_config_error_on_the_type_key():
    with pytest.raises(ConfigError) as e:
        make_image_source("sensor_msgs/PointCloud2", Section({}, PREFIX))
    assert e.value.key == f"{PREFIX}.type"
    assert "sensor_msgs/CompressedImage" in str(e.value)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"resize": [0, 5]}, "resize"),
        ({"resize": [5]}, "resize"),
        ({"crop": [-1, 0, 2, 2]}, "crop"),
        ({"crop": [0, 0, 0, 2]}, "crop"),
        ({"crop": [0, 0, 2]}, "crop"),
        ({"channels": 2}, "channels"),
        ({"depth_scale": 0.0}, "depth_scale"),
        ({"depth_scale": -1}, "depth_scale"),
    ],
)
def test_bad_image_config_is_a_config_error_with_the_full_key(values, key):
    with pytest.raises(ConfigError) as e:
        make_image_source("sensor_msgs/Image", Section(values, PREFIX))
    assert e.value.key == f"{PREFIX}.{key}"


def test_depth_scale_is_not_a_key_of_compressed_images():
    sec = Section({"depth_scale": 2.0}, PREFIX)
    make_image_source("sensor_msgs/CompressedImage", sec)
    with pytest.raises(ConfigError, match=rf"{PREFIX}\.depth_scale"):
        sec.finish()


# --- raw encodings -------------------------------------------------------------------


def test_rgb8_is_returned_as_is():
    img = source().convert(image(PICTURE, "rgb8"))
    check_output(img, (5, 7, 3))
    np.testing.assert_array_equal(img, PICTURE)


@pytest.mark.parametrize(
    ("encoding", "pixels"),
    [
        ("bgr8", PICTURE[:, :, ::-1]),
        ("8UC3", PICTURE[:, :, ::-1]),
        ("rgba8", np.dstack([PICTURE, np.full((5, 7), 9, np.uint8)])),
        ("bgra8", np.dstack([PICTURE[:, :, ::-1], np.full((5, 7), 9, np.uint8)])),
    ],
)
def test_color_encodings_give_the_same_rgb_picture(encoding, pixels):
    img = source().convert(image(np.ascontiguousarray(pixels), encoding))
    check_output(img, (5, 7, 3))
    np.testing.assert_array_equal(img, PICTURE)


@pytest.mark.parametrize("encoding", ["mono8", "8UC1"])
def test_mono8_is_replicated_to_three_channels(encoding):
    gray = PICTURE[:, :, 0].copy()
    img = source().convert(image(gray, encoding))
    check_output(img, (5, 7, 3))
    for c in range(3):
        np.testing.assert_array_equal(img[:, :, c], gray)


def test_mono8_with_one_channel_keeps_the_values():
    gray = PICTURE[:, :, 1].copy()
    img = source(channels=1).convert(image(gray, "mono8"))
    check_output(img, (5, 7, 1))
    np.testing.assert_array_equal(img[:, :, 0], gray)


@pytest.mark.parametrize(
    ("encoding", "pixels"),
    [("rgb8", PICTURE), ("bgr8", PICTURE[:, :, ::-1]), ("bgra8", np.dstack([PICTURE[:, :, ::-1], PICTURE[:, :, :1]]))],
)
def test_color_to_one_channel_is_luma(encoding, pixels):
    img = source(channels=1).convert(image(np.ascontiguousarray(pixels), encoding))
    check_output(img, (5, 7, 1))
    assert np.abs(img[:, :, 0].astype(float) - luma(PICTURE)).max() <= 1.0


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "mono8", "16UC1"])
def test_row_padding_is_skipped(encoding):
    plain = {"rgb8": PICTURE, "bgr8": PICTURE[:, :, ::-1], "mono8": PICTURE[:, :, 0]}.get(encoding)
    if encoding == "16UC1":
        plain = PICTURE[:, :, 0].astype(np.uint16)
    plain = np.ascontiguousarray(plain)
    expected = source().convert(image(plain, encoding))
    padded = image(plain, encoding, pad=6)
    assert padded.step > padded.width * plain.itemsize * (plain.shape[2] if plain.ndim == 3 else 1)
    np.testing.assert_array_equal(source().convert(padded), expected)


def test_plain_rgb8_is_a_read_only_view_of_the_message_buffer():
    msg = image(PICTURE, "rgb8")
    img = source().convert(msg)
    assert np.shares_memory(img, np.frombuffer(msg.data, dtype=np.uint8))
    assert not img.flags.writeable


def test_padded_or_converted_images_are_fresh_writable_copies():
    for msg, src in [(image(PICTURE, "rgb8", pad=3), source()), (image(PICTURE, "rgb8"), source(resize=[2, 3]))]:
        img = src.convert(msg)
        assert not np.shares_memory(img, np.frombuffer(msg.data, dtype=np.uint8))
        assert img.flags.writeable


@pytest.mark.parametrize("bigendian", [False, True])
@pytest.mark.parametrize("encoding", ["16UC1", "mono16"])
def test_16bit_depth_is_scaled_and_saturated_in_either_byte_order(encoding, bigendian):
    depth = np.array([[0, 100, 1000], [2549, 2551, 65535]], dtype=np.uint16)
    raw = depth.astype(">u2" if bigendian else "<u2")
    img = source(depth_scale=0.1).convert(image(raw, encoding, bigendian=bigendian))
    check_output(img, (2, 3, 3))
    # 1000 read in the wrong byte order is 59395, which would saturate to 255;
    # 2549 * 0.1 = 254.9 rounds to 255 (truncating would give 254).
    expected = np.array([[0, 10, 100], [255, 255, 255]], dtype=np.uint8)
    for c in range(3):
        np.testing.assert_array_equal(img[:, :, c], expected)


def test_16bit_depth_default_scale_saturates_at_255():
    depth = np.array([[0, 7, 255, 256, 4000]], dtype=np.uint16)
    img = source(channels=1).convert(image(depth, "16UC1"))
    np.testing.assert_array_equal(img[0, :, 0], [0, 7, 255, 255, 255])


@pytest.mark.parametrize("bigendian", [False, True])
def test_32fc1_depth_is_scaled_and_invalid_values_become_zero(bigendian):
    depth = np.array([[0.5, 1.0, 3.0, np.nan, -1.0, np.inf]], dtype=np.float32)
    raw = depth.astype(">f4" if bigendian else "<f4")
    img = source(depth_scale=50.0, channels=1).convert(image(raw, "32FC1", bigendian=bigendian))
    check_output(img, (1, 6, 1))
    np.testing.assert_array_equal(img[0, :, 0], [25, 50, 150, 0, 0, 255])


def test_unsupported_encoding_is_a_conversion_error_listing_the_supported_ones():
    msg = image(PICTURE[:, :, :2].copy(), "yuv422")
    with pytest.raises(ConversionError) as e:
        source().convert(msg)
    assert "'yuv422'" in str(e.value)
    for name in ENCODINGS:
        assert name in str(e.value)


def test_data_shorter_than_rows_is_a_conversion_error():
    msg = image(PICTURE, "rgb8")
    msg.data = msg.data[:-1]
    with pytest.raises(ConversionError, match="bytes"):
        source().convert(msg)


def test_step_shorter_than_a_row_is_a_conversion_error():
    msg = image(PICTURE, "rgb8")
    msg.step = 7 * 3 - 1
    with pytest.raises(ConversionError, match="step 20"):
        source().convert(msg)


def test_empty_image_is_a_conversion_error():
    with pytest.raises(ConversionError, match="empty"):
        source().convert(Image(height=0, width=0, encoding="rgb8", step=0))


# --- crop and resize --------------------------------------------------------------------


def test_crop_selects_rows_then_columns():
    img = source(crop=[1, 2, 3, 4]).convert(image(np.ascontiguousarray(PICTURE[:, :, ::-1]), "bgr8"))
    check_output(img, (3, 4, 3))
    np.testing.assert_array_equal(img, PICTURE[1:4, 2:6])


def test_crop_then_resize_gives_the_resized_shape():
    img = source(crop=[1, 2, 3, 4], resize=[6, 10]).convert(image(PICTURE, "rgb8"))
    check_output(img, (6, 10, 3))


def test_crop_that_does_not_fit_is_a_conversion_error():
    with pytest.raises(ConversionError, match="does not fit the 5x7 image"):
        source(crop=[3, 0, 3, 7]).convert(image(PICTURE, "rgb8"))


def test_shrinking_averages_blocks():
    big = RNG.integers(0, 256, size=(8, 12, 3), dtype=np.uint8)
    img = source(resize=[4, 6]).convert(image(big, "rgb8"))
    check_output(img, (4, 6, 3))
    block_mean = big.reshape(4, 2, 6, 2, 3).astype(np.float64).mean(axis=(1, 3))
    assert np.abs(img.astype(np.float64) - block_mean).max() <= 0.5 + 1e-9


def test_enlarging_a_mono_image_keeps_a_constant_image_constant_and_replicates_channels():
    flat = np.full((3, 4), 77, dtype=np.uint8)
    img = source(resize=[9, 10]).convert(image(flat, "mono8"))
    check_output(img, (9, 10, 3))
    assert (img == 77).all()


def test_resize_to_one_channel_keeps_the_channel_axis():
    img = source(resize=[2, 3], channels=1).convert(image(PICTURE, "rgb8"))
    check_output(img, (2, 3, 1))


# --- compressed ---------------------------------------------------------------------------


def smooth_picture(height: int = 32, width: int = 48) -> np.ndarray:
    """A gradient: JPEG reproduces it closely, so a tight tolerance still catches channel swaps."""
    y, x = np.mgrid[0:height, 0:width]
    return np.dstack([x * 255 // (width - 1), y * 255 // (height - 1), np.full_like(x, 128)]).astype(np.uint8)


def test_png_round_trip_is_exact_rgb():
    msg = compressed(np.ascontiguousarray(PICTURE[:, :, ::-1]), ".png", "png")
    img = source("sensor_msgs/CompressedImage").convert(msg)
    check_output(img, (5, 7, 3))
    np.testing.assert_array_equal(img, PICTURE)


def test_jpeg_round_trip_is_rgb_within_jpeg_tolerance():
    rgb = smooth_picture()
    msg = compressed(np.ascontiguousarray(rgb[:, :, ::-1]), ".jpg", "rgb8; jpeg compressed bgr8")
    img = source("sensor_msgs/CompressedImage").convert(msg)
    check_output(img, rgb.shape)
    diff = np.abs(img.astype(int) - rgb.astype(int))
    assert diff.mean() < 3
    assert diff.max() < 20  # a red/blue swap would differ by up to 127 here


def test_compressed_gray_png_with_one_channel_is_exact():
    gray = PICTURE[:, :, 2].copy()
    img = source("sensor_msgs/CompressedImage", channels=1).convert(compressed(gray, ".png", "mono8; png compressed"))
    check_output(img, (5, 7, 1))
    np.testing.assert_array_equal(img[:, :, 0], gray)


def test_compressed_crop_and_resize_apply_after_decoding():
    msg = compressed(np.ascontiguousarray(PICTURE[:, :, ::-1]), ".png", "png")
    img = source("sensor_msgs/CompressedImage", crop=[1, 1, 4, 6]).convert(msg)
    np.testing.assert_array_equal(img, PICTURE[1:5, 1:7])
    img = source("sensor_msgs/CompressedImage", crop=[1, 1, 4, 6], resize=[2, 3]).convert(msg)
    check_output(img, (2, 3, 3))


def test_undecodable_compressed_data_is_a_conversion_error():
    msg = CompressedImage(format="jpeg")
    msg.data = b"this is not a jpeg at all"
    with pytest.raises(ConversionError, match="could not decode"):
        source("sensor_msgs/CompressedImage").convert(msg)


def test_empty_compressed_data_is_a_conversion_error():
    with pytest.raises(ConversionError, match="no data"):
        source("sensor_msgs/CompressedImage").convert(CompressedImage(format="png"))


def test_compressed_depth_is_refused_with_a_hint():
    msg = compressed(PICTURE[:, :, 0].copy(), ".png", "16UC1; compressedDepth png")
    with pytest.raises(ConversionError, match="compressedDepth"):
        source("sensor_msgs/CompressedImage").convert(msg)
