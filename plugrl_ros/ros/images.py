"""Image sources: a sensor_msgs Image or CompressedImage in, one env's uint8 [h, w, c] RGB (or gray) picture out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from sensor_msgs.msg import CompressedImage, Image

from plugrl_ros import opencv
from plugrl_ros.params.section import ConfigError, Section
from plugrl_ros.ros.cdr import CompressedImageView, ImageView, parse_compressed_image, parse_image
from plugrl_ros.ros.sources import ConversionError, deserialized, registered

try:
    import cv2
except ImportError:  # optional (a plain pip install has none): make_image_source says what to install
    cv2 = None


class ImageSource(Protocol):
    """Turns one message (typed, or serialized: what a ``raw=True`` subscription takes) into one env's image."""

    msg_type: type
    # whether converting a message is real work (decoding, resizing) worth starting off the control tick
    # as soon as it arrives, or cheap enough (a view of the message) to do when the image is needed
    costly: bool

    def convert(self, msg: Any) -> np.ndarray: ...


@dataclass(frozen=True)
class _Encoding:
    """How the bytes of one sensor_msgs/Image encoding are laid out."""

    channels: int
    dtype: str  # numpy kind+size; byte order comes from is_bigendian
    order: str  # "RGB", "BGR", "RGBA", "BGRA", "GRAY", or "DEPTH" (scaled to gray by depth_scale)


_RGB8 = _Encoding(3, "u1", "RGB")
_BGR8 = _Encoding(3, "u1", "BGR")
_MONO8 = _Encoding(1, "u1", "GRAY")
_DEPTH16 = _Encoding(1, "u2", "DEPTH")
ENCODINGS: dict[str, _Encoding] = {
    "rgb8": _RGB8,
    "bgr8": _BGR8,
    "rgba8": _Encoding(4, "u1", "RGBA"),
    "bgra8": _Encoding(4, "u1", "BGRA"),
    "mono8": _MONO8,
    # cv_bridge's reading of the OpenCV type names: 3 channels are BGR.
    "8UC1": _MONO8,
    "8UC3": _BGR8,
    "16UC1": _DEPTH16,
    "mono16": _DEPTH16,
    "32FC1": _Encoding(1, "f4", "DEPTH"),
}

# Color conversions run before resizing when they drop channels (less to resize)...
_TO_GRAY = (
    {
        "RGB": cv2.COLOR_RGB2GRAY,
        "BGR": cv2.COLOR_BGR2GRAY,
        "RGBA": cv2.COLOR_RGBA2GRAY,
        "BGRA": cv2.COLOR_BGRA2GRAY,
    }
    if cv2
    else {}
)
_DROP_ALPHA = {"RGBA": cv2.COLOR_RGBA2RGB, "BGRA": cv2.COLOR_BGRA2RGB} if cv2 else {}


@dataclass(frozen=True)
class _Shaping:
    """crop -> resize -> channels, shared by both image types."""

    crop: tuple[int, int, int, int] | None  # y, x, height, width
    resize: tuple[int, int] | None  # height, width
    channels: int

    @classmethod
    def from_section(cls, section: Section) -> _Shaping:
        crop = None
        if section.has("crop"):
            y, x, height, width = section.int_list("crop", length=4)
            if y < 0 or x < 0 or height <= 0 or width <= 0:
                raise ConfigError(
                    section.key("crop"),
                    [y, x, height, width],
                    "expected [y, x, height, width] with y, x >= 0 and height, width > 0",
                )
            crop = (y, x, height, width)
        resize = None
        if section.has("resize"):
            height, width = section.int_list("resize", length=2)
            if height <= 0 or width <= 0:
                raise ConfigError(
                    section.key("resize"), [height, width], "expected [height, width], both greater than 0"
                )
            resize = (height, width)
        channels = section.int("channels")
        if channels not in (1, 3):
            raise ConfigError(section.key("channels"), channels, "allowed: 3 (RGB) or 1 (gray)")
        return cls(crop, resize, channels)

    def cropped(self, pixels: np.ndarray) -> np.ndarray:
        if self.crop is None:
            return pixels
        y, x, height, width = self.crop
        if y + height > pixels.shape[0] or x + width > pixels.shape[1]:
            raise ConversionError(
                f"crop [y={y}, x={x}, height={height}, width={width}] does not fit the"
                f" {pixels.shape[0]}x{pixels.shape[1]} image (height x width)"
            )
        return pixels[y : y + height, x : x + width]

    def finished(self, img: np.ndarray, order: str) -> np.ndarray:
        """Channels and size as configured, from a uint8 [h, w] gray or [h, w, c] image in ``order``."""
        if self.channels == 1 and order != "GRAY":
            img, order = cv2.cvtColor(img, _TO_GRAY[order]), "GRAY"
        elif self.channels == 3 and order in _DROP_ALPHA:
            img, order = cv2.cvtColor(img, _DROP_ALPHA[order]), "RGB"
        if self.resize is not None and self.resize != img.shape[:2]:
            height, width = self.resize
            # INTER_AREA averages the pixels a target pixel covers (no aliasing
            # when shrinking) but is blocky when enlarging, where LINEAR is right.
            shrinking = height <= img.shape[0] and width <= img.shape[1]
            img = cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR)
        # ...and after it when they keep or add channels.
        if order == "BGR":
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        elif order == "GRAY" and self.channels == 3:
            img = cv2.cvtColor(img, cv2.COLOR_GRAY2RGB)
        if img.ndim == 2:
            img = img[:, :, np.newaxis]
        return np.ascontiguousarray(img)


def _byte_array(data: Any) -> np.ndarray:
    """The message's uint8[] as a numpy view (rclpy stores it as array.array; a list is copied)."""
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except TypeError:
        return np.asarray(data, dtype=np.uint8)


def _read_only_if_shared(img: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    # A result that is still a view of the message (no conversion was needed)
    # is handed out read-only, so nobody can write into a received message.
    if np.may_share_memory(img, buffer):
        img.flags.writeable = False
    return img


class RawImageSource:
    """sensor_msgs/Image in the 8-bit color/mono and 16/32-bit depth encodings of ``ENCODINGS``."""

    msg_type = Image

    def __init__(self, section: Section) -> None:
        self.shaping = _Shaping.from_section(section)
        self.depth_scale = section.float("depth_scale")
        self.costly = self.shaping.resize is not None

    def _pixels(self, msg: Image | ImageView, enc: _Encoding, data: np.ndarray) -> np.ndarray:
        """A [h, w, c] view of the message data that skips each row's padding."""
        height, width, step = msg.height, msg.width, msg.step
        if height == 0 or width == 0:
            raise ConversionError(f"the image is empty ({height}x{width})")
        dtype = np.dtype(enc.dtype).newbyteorder(">" if msg.is_bigendian else "<")
        row_bytes = width * enc.channels * dtype.itemsize
        if step < row_bytes:
            raise ConversionError(
                f"step {step} is shorter than one row of a {width} pixel wide '{msg.encoding}' image"
                f" ({row_bytes} bytes)"
            )
        if len(data) < step * height:
            raise ConversionError(
                f"the image has {len(data)} bytes of data; {height} rows of step {step} need {step * height}"
            )
        return np.ndarray(
            shape=(height, width, enc.channels),
            dtype=dtype,
            buffer=data,
            strides=(step, enc.channels * dtype.itemsize, dtype.itemsize),
        )

    def _depth_to_uint8(self, depth: np.ndarray) -> np.ndarray:
        scaled = depth.astype(np.float32)
        scaled *= self.depth_scale
        # Depth cameras mark "no return" as NaN (32FC1); 0 is the same
        # convention for 16-bit depth, so NaN pixels become 0, never garbage.
        np.nan_to_num(scaled, copy=False, nan=0.0, posinf=255.0, neginf=0.0)
        np.clip(scaled, 0.0, 255.0, out=scaled)
        np.rint(scaled, out=scaled)
        return scaled.astype(np.uint8)

    def convert(self, msg: Image | ImageView | bytes) -> np.ndarray:
        """The image of a message, typed or serialized (whose pixels are then read in place)."""
        if type(msg) is bytes:
            msg = parse_image(msg) or deserialized(msg, Image)
        enc = ENCODINGS.get(msg.encoding)
        if enc is None:
            raise ConversionError(
                f"image encoding '{msg.encoding}' is not supported; supported: {', '.join(ENCODINGS)}"
            )
        data = _byte_array(msg.data)
        pixels = self.shaping.cropped(self._pixels(msg, enc, data))
        if enc.order == "DEPTH":
            img, order = self._depth_to_uint8(pixels[:, :, 0]), "GRAY"
        elif enc.order == "GRAY":
            img, order = pixels[:, :, 0], "GRAY"
        else:
            img, order = pixels, enc.order
        return _read_only_if_shared(self.shaping.finished(img, order), data)


class CompressedImageSource:
    """sensor_msgs/CompressedImage (jpeg, png), decoded with OpenCV."""

    msg_type = CompressedImage
    costly = True

    def __init__(self, section: Section) -> None:
        self.shaping = _Shaping.from_section(section)
        # Decoding straight to gray or (OpenCV >= 4.10) to RGB skips a color
        # conversion: a third of the time of a 640x480 JPEG.
        if self.shaping.channels == 1:
            self._flag, self._order = cv2.IMREAD_GRAYSCALE, "GRAY"
        elif hasattr(cv2, "IMREAD_COLOR_RGB"):
            self._flag, self._order = cv2.IMREAD_COLOR_RGB, "RGB"
        else:
            self._flag, self._order = cv2.IMREAD_COLOR, "BGR"

    def convert(self, msg: CompressedImage | CompressedImageView | bytes) -> np.ndarray:
        """The decoded image of a message, typed or serialized (decoded from the serialized bytes in place)."""
        if type(msg) is bytes:
            msg = parse_compressed_image(msg) or deserialized(msg, CompressedImage)
        if "compresseddepth" in msg.format.lower():
            raise ConversionError(
                f"CompressedImage format '{msg.format}' (compressed_depth_image_transport) is not supported;"
                " subscribe to the raw depth image or to a jpeg/png stream"
            )
        data = _byte_array(msg.data)
        if len(data) == 0:
            raise ConversionError("the CompressedImage has no data")
        try:
            img = cv2.imdecode(data, self._flag)
        except cv2.error as e:
            raise ConversionError(f"OpenCV could not decode the CompressedImage (format '{msg.format}'): {e}") from e
        if img is None:
            raise ConversionError(
                f"could not decode the CompressedImage ({len(data)} bytes, format '{msg.format}') as jpeg or png"
            )
        order = "GRAY" if img.ndim == 2 else self._order
        return self.shaping.finished(self.shaping.cropped(img), order)


IMAGE_SOURCES: dict[str, type] = {
    "sensor_msgs/Image": RawImageSource,
    "sensor_msgs/CompressedImage": CompressedImageSource,
}


def make_image_source(type_name: str, section: Section) -> ImageSource:
    """The image source for ``type_name``, configured from ``section`` (ConfigError for a bad type or key)."""
    if cv2 is None:
        raise ConfigError(
            section.prefix,
            section.values(),
            f"image sources need OpenCV, which cannot be imported ({opencv.missing()}); {opencv.INSTALL}",
        )
    return registered(IMAGE_SOURCES, type_name, section)(section)
