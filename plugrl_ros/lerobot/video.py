"""One camera's frames as one MP4 stream (PyAV), every episode after the previous, as LeRobot stores videos.

Two codecs. ``av1`` is what LeRobot writes by default (SVT-AV1, yuv420p, a key
frame every 2 frames, CRF 30, preset 12): small files, decoded within the
codec's loss (chroma is halved, colours shift by a few levels). ``lossless``
is H.264 in RGB with a quantiser of 0 (libx264rgb, rgb24): every pixel decodes
as recorded, at several times the size; LeRobot's decoders read it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np


@dataclass(frozen=True)
class Codec:
    name: str  # the encoder
    pix_fmt: str
    options: dict[str, str] = field(default_factory=dict)


CODECS = {
    "av1": Codec("libsvtav1", "yuv420p", {"g": "2", "crf": "30", "preset": "12"}),
    "lossless": Codec("libx264rgb", "rgb24", {"g": "2", "qp": "0"}),
}


SVT_MIN_SIZE = 32


def png(image: np.ndarray) -> bytes:
    """``image`` [h, w, 3] uint8 as a PNG file (lossless), for a dataset that keeps its images in the Parquet."""
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"images of shape {list(image.shape)}: a LeRobot image is RGB (h, w, 3)")
    context = av.codec.CodecContext.create("png", "w")
    context.width, context.height, context.pix_fmt = image.shape[1], image.shape[0], "rgb24"
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
    return b"".join(bytes(packet) for packet in [*context.encode(frame), *context.encode(None)])


class VideoStream:
    """An MP4 file taking RGB frames [h, w, 3] uint8 at ``fps``; frame i is shown at i / fps seconds."""

    def __init__(self, path: Path, fps: int, codec: Codec) -> None:
        self.path = path
        self.fps = fps
        self.codec = codec
        self.frames = 0
        self._container: Any = None
        self._stream: Any = None

    def write(self, images: np.ndarray) -> None:
        """Appends ``images`` [n, h, w, 3]."""
        for image in images:
            if self._stream is None:
                self._open(image.shape)
            if image.shape != self.shape:
                raise ValueError(f"a {list(image.shape)} image in a video of {list(self.shape)} images")
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame.pts = self.frames
            frame.time_base = Fraction(1, self.fps)
            self._container.mux(self._stream.encode(frame))
            self.frames += 1

    def close(self) -> None:
        if self._stream is not None:
            self._container.mux(self._stream.encode(None))  # what the encoder still holds
            self._container.close()
            self._stream = None

    def _open(self, shape: tuple[int, ...]) -> None:
        if len(shape) != 3 or shape[2] != 3:
            raise ValueError(f"images of shape {list(shape)}: a LeRobot video takes RGB images (h, w, 3)")
        if self.codec.name == "libsvtav1" and (shape[0] % 2 or shape[1] % 2 or min(shape[:2]) < SVT_MIN_SIZE):
            # SVT-AV1 takes even sizes only, and its process died (SIGFPE) on 16 x 16 images
            raise ValueError(
                f"{shape[1]} x {shape[0]} images: {self.codec.name} takes even sizes of {SVT_MIN_SIZE} pixels "
                "or more (--video-codec lossless takes any size)"
            )
        self.shape = tuple(shape)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._container = av.open(str(self.path), "w")
        self._stream = self._container.add_stream(self.codec.name, rate=self.fps, options=dict(self.codec.options))
        self._stream.width, self._stream.height = shape[1], shape[0]
        self._stream.pix_fmt = self.codec.pix_fmt
        self._stream.time_base = Fraction(1, self.fps)

    def info(self) -> dict[str, Any]:
        """The feature's ``info`` in meta/info.json, as LeRobot writes it: read from the closed file."""
        with av.open(str(self.path)) as container:
            stream = container.streams.video[0]
            codec, pix_fmt = stream.codec_context.codec.canonical_name, stream.pix_fmt
        return {
            "video.height": int(self.shape[0]),
            "video.width": int(self.shape[1]),
            "video.codec": codec,
            "video.pix_fmt": pix_fmt,
            "video.is_depth_map": False,
            "video.fps": self.fps,
            "video.channels": 3,
            "has_audio": False,
        }
