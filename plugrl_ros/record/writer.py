"""The MCAP side of a recording: files, rotation, ROS 2 encoding; driven by one thread, here or in a writer process.

:class:`RunWriter` turns recorder calls (kind, env, time, call number,
payload) into channel messages (:mod:`plugrl_ros.record.channels`) in the
current file, starts a new file when the current one is big or long
enough (repeating the run's configuration at its top), and closes chunks on
request, which is what makes them survive a killed process.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np
from mcap.records import Schema
from mcap.writer import CompressionType
from mcap_ros2.writer import Writer as Ros2Writer

from plugrl_ros.record import channels, schemas
from plugrl_ros.record.channels import Kind
from plugrl_ros.record.settings import RecordSettings

Opener = Callable[[Path], IO[bytes]]

_COMPRESSION = {"none": CompressionType.NONE, "lz4": CompressionType.LZ4, "zstd": CompressionType.ZSTD}


def exclusive_open(path: Path) -> IO[bytes]:
    return open(path, "xb")  # never overwrite a recording


def image_encoder(settings: RecordSettings) -> channels.ImageEncoder:
    if settings.image_format == "raw":
        return None
    import cv2  # checked at configuration time; only needed when compressing

    ext = ".jpg" if settings.image_format == "jpeg" else ".png"
    params = [cv2.IMWRITE_JPEG_QUALITY, settings.jpeg_quality] if ext == ".jpg" else []

    def encode(image: np.ndarray) -> tuple[str, bytes]:
        channels_in = image.shape[2]
        if channels_in == 1:
            source, fmt = image, f"mono8; {settings.image_format} compressed mono8"
        else:  # OpenCV writes BGR; image_transport's format string says both orders
            code = cv2.COLOR_RGB2BGR if channels_in == 3 else cv2.COLOR_RGBA2BGRA
            source = cv2.cvtColor(image, code)
            fmt = f"{'rgb8' if channels_in == 3 else 'rgba8'}; {settings.image_format} compressed bgr8"
        ok, data = cv2.imencode(ext, source, params)
        if not ok:
            raise RuntimeError(f"OpenCV could not encode a {image.shape} image as {settings.image_format}")
        return fmt, data.tobytes()

    return encode


class _McapFile:
    """One open MCAP file: its ROS 2 writer, the schemas registered in it, the time span it covers."""

    def __init__(self, path: Path, stream: IO[bytes], settings: RecordSettings) -> None:
        self.path = path
        # Buffer a raw stream here rather than let mcap wrap it out of our reach: flushes must reach it.
        self.stream: IO[bytes] = io.BufferedWriter(stream) if isinstance(stream, io.RawIOBase) else stream
        self.writer = Ros2Writer(
            self.stream, chunk_size=settings.chunk_bytes, compression=_COMPRESSION[settings.compression]
        )
        self.schemas: dict[str, Schema] = {}
        self.first_t: int | None = None

    def write(self, topic: str, schema_name: str, body: dict, t_ns: int, sequence: int) -> None:
        schema = self.schemas.get(schema_name)
        if schema is None:
            schema = self.schemas[schema_name] = self.writer.register_msgdef(
                schema_name, schemas.definition(schema_name)
            )
        self.writer.write_message(topic, schema, body, log_time=t_ns, publish_time=t_ns, sequence=sequence)

    def close_chunk(self) -> None:
        """Close the chunk in progress and hand it to the OS: from now on a killed process keeps it."""
        # mcap-ros2-support's Writer has no flush of its own; its McapWriter (``_writer``) does.
        self.writer._writer.flush()

    def finish(self) -> None:
        self.writer.finish()
        self.stream.close()


class RunWriter:
    """Writes one run's calls into ``settings.path/<stem>_<part>.mcap`` files."""

    def __init__(
        self,
        settings: RecordSettings,
        stem: str,
        opener: Opener = exclusive_open,
        on_open: Callable[[Path], None] | None = None,
    ) -> None:
        assert settings.path is not None
        self.settings = settings
        self.stem = stem
        self.files: list[Path] = []
        self.written = 0  # calls written (their messages handed to the MCAP writer)
        self._opener = opener
        self._on_open = on_open
        self._file: _McapFile | None = None
        self._config: tuple[int, int, str] | None = None  # (t_ns, seq, JSON): repeated at the top of every file
        self._last_t = 0
        self._reported_dropped = -1
        self._counts = (0, 0, 0)  # the calling side's (accepted, dropped, dropped_large)
        self._encode = image_encoder(settings)

    def open_first(self) -> Path:
        self._file = self._open(0)
        return self._file.path

    def _open(self, part: int) -> _McapFile:
        assert self.settings.path is not None
        path = self.settings.path / f"{self.stem}_{part}.mcap"
        stream = self._opener(path)
        self.files.append(path)
        if self._on_open is not None:
            self._on_open(path)
        return _McapFile(path, stream, self.settings)

    def write(self, kind: Kind, env: int, t_ns: int, seq: int, payload: Any) -> None:
        assert self._file is not None
        if kind is Kind.CONFIG:
            self._config = (t_ns, seq, payload)
        elif self._rotation_due(t_ns):
            self._rotate()
        if self._file.first_t is None and kind is not Kind.CONFIG:
            self._file.first_t = t_ns
        self._last_t = max(self._last_t, t_ns)
        for topic, schema_name, body in channels.messages(kind, env, t_ns, payload, self._encode):
            self._file.write(topic, schema_name, body, t_ns, seq % (1 << 32))
        self.written += 1

    def _rotation_due(self, t_ns: int) -> bool:
        file = self._file
        assert file is not None
        if file.first_t is None:
            return False
        max_bytes, max_s = self.settings.max_file_bytes, self.settings.max_file_duration_s
        if max_bytes is not None and file.stream.tell() >= max_bytes:
            return True
        return max_s is not None and t_ns - file.first_t >= max_s * 1e9

    def _rotate(self) -> None:
        assert self._file is not None
        self.report_drops(final=True)
        self._file.finish()
        self._file = self._open(len(self.files))
        if self._config is not None:  # every file says how the run was configured
            t_ns, seq, text = self._config
            for topic, schema_name, body in channels.messages(Kind.CONFIG, -1, t_ns, text, None):
                self._file.write(topic, schema_name, body, t_ns, seq)

    def counts(self, accepted: int, dropped: int, dropped_large: int) -> None:
        """The calling side's queue counts, for the recorder's own status messages."""
        self._counts = (accepted, dropped, dropped_large)

    def report_drops(self, final: bool) -> None:
        """Put the recorder's own counts in the file: when drops grew, and before a file is finished."""
        accepted, dropped, dropped_large = self._counts
        if not final and dropped == max(self._reported_dropped, 0):
            return
        self._reported_dropped = dropped
        level = channels.WARN if dropped else channels.OK
        values = {"accepted": accepted, "dropped": dropped, "dropped_large": dropped_large}
        message = f"{dropped} call(s) dropped: the writer fell behind" if dropped else "ok"
        assert self._file is not None
        for topic, schema_name, body in channels.messages(
            Kind.RECORDER, -1, self._last_t, (level, message, values), None
        ):
            self._file.write(topic, schema_name, body, self._last_t, 0)

    def close_chunk(self) -> None:
        assert self._file is not None
        self._file.close_chunk()

    def flush(self) -> None:
        """Hand the chunks closed by size to the OS."""
        assert self._file is not None
        self._file.stream.flush()

    def finish(self) -> None:
        """Finish the current file (its summary makes it seekable)."""
        self.report_drops(final=True)
        assert self._file is not None
        self._file.finish()

    def failure(self, exc: BaseException) -> str:
        """The message for a write that failed, after letting go of the file."""
        where = f" ({self._file.path})" if self._file is not None else ""
        detail = f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) else str(exc)
        message = f"recording stopped: {detail}{where}; the robot keeps running"
        if self._file is not None:
            try:
                self._file.stream.close()
            except OSError as close_exc:  # a full disk fails the final flush too: say so, keep the first cause
                message += f" (closing the file also failed: {close_exc})"
        return message
