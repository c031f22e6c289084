"""The recorder: a small typed API the control thread calls, and a writer thread that makes MCAP of it.

It observes and never steers. Every call only puts a reference on a
bounded queue (:class:`DropQueue`) and returns; converting to ROS messages,
compressing and writing happen on the writer thread. When the writer falls
behind, calls are dropped and counted; when writing fails (a full disk, a
removed drive) recording stops with an error state that the node shows on
/diagnostics and in its log: nothing here ever raises into the caller after
:meth:`Recorder.start`.

Arrays handed to a call are kept by reference until written: the caller
must not modify them in place afterwards (the bridge never does: every
observation, chunk and command is a fresh array).
"""

from __future__ import annotations

import datetime
import io
import itertools
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
from mcap.records import Schema
from mcap.writer import CompressionType
from mcap_ros2.writer import Writer as Ros2Writer

from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.record import channels, schemas
from plugrl_ros.record.channels import Kind
from plugrl_ros.record.drop_queue import DropQueue
from plugrl_ros.record.settings import RecordSettings

Opener = Callable[[Path], IO[bytes]]

_COMPRESSION = {"none": CompressionType.NONE, "lz4": CompressionType.LZ4, "zstd": CompressionType.ZSTD}
_SMALL = 256  # bytes a call's Python objects weigh beyond its arrays (a rough, conservative figure)


class RecordError(Exception):
    """Recording cannot start (folder not writable, a message definition missing): a user can fix it."""


class RecorderState(Enum):
    OFF = "off"
    RECORDING = "recording"
    STOPPED = "stopped"  # closed normally
    FAILED = "failed"  # a write failed: recording stopped, the robot did not


@dataclass(frozen=True)
class RecorderStatus:
    """What /diagnostics shows about recording."""

    state: RecorderState
    error: str  # why FAILED, else ""
    accepted: int  # calls queued
    dropped: int  # calls dropped because the writer fell behind
    dropped_large: int  # of those, calls carrying images
    written: int  # calls written (their messages handed to the MCAP writer)
    queued_bytes: int
    files: tuple[Path, ...]


def _exclusive_open(path: Path) -> IO[bytes]:
    return open(path, "xb")  # never overwrite a recording


def _image_encoder(settings: RecordSettings) -> channels.ImageEncoder:
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


class Recorder:
    """Record one run into ``settings.path``; every method but :meth:`start` and :meth:`close` never blocks.

    Times are integer nanoseconds of the caller's clock (the node's ROS clock,
    so sim time when ``use_sim_time`` is set): each message is stamped with
    the time its event happened, not the time it was written.
    """

    def __init__(
        self,
        settings: RecordSettings,
        opener: Opener = _exclusive_open,
        on_error: Callable[[str], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        assert settings.path is not None, "a Recorder needs record.path"
        self.settings = settings
        self._opener = opener
        self._on_error = on_error
        self._wall_clock = wall_clock
        # (kind, env, t_ns, payload); the queue numbers every call, dropped or not: the MCAP sequence
        self._queue: DropQueue[tuple[Kind, int, int, Any]] = DropQueue(settings.queue_bytes)
        self._state = RecorderState.OFF
        self._error = ""
        self._written = 0
        self._files: list[Path] = []
        self._stem = ""
        self._file: _McapFile | None = None
        self._config: tuple[int, int, str] | None = None  # (t_ns, seq, JSON): repeated at the top of every file
        self._last_t = 0
        self._reported_dropped = 0
        self._durable = 0  # calls written whose chunk has reached the OS
        self._sync_wanted = False
        self._synced = threading.Condition()
        self._encode: channels.ImageEncoder = None
        self._thread = threading.Thread(target=self._run, name="plugrl-recorder", daemon=True)

    # -- lifecycle (startup / shutdown: these may block and raise) -----------

    def start(self) -> Path:
        """Open the run's first file and start writing; a problem a user can fix raises :class:`RecordError`."""
        assert self._state is RecorderState.OFF, "start() once"
        folder = self.settings.path
        assert folder is not None
        try:
            for name in schemas.ALL:
                schemas.definition(name)
        except schemas.SchemaNotFound as exc:
            raise RecordError(str(exc)) from None
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RecordError(f"record.path: cannot create the folder {folder}: {exc.strerror}") from None
        self._encode = _image_encoder(self.settings)
        started = datetime.datetime.fromtimestamp(self._wall_clock(), tz=datetime.timezone.utc)
        self._stem = "plugrl_" + started.strftime("%Y_%m_%d-%H_%M_%S")
        for attempt in itertools.count():
            stem = self._stem if attempt == 0 else f"{self._stem}-{attempt}"
            if not any(folder.glob(f"{stem}_*.mcap")):
                self._stem = stem
                break
        try:
            self._file = self._open(0)
        except OSError as exc:
            raise RecordError(f"record.path: cannot write a recording in {folder}: {exc.strerror or exc}") from None
        self._state = RecorderState.RECORDING
        self._thread.start()
        return self._file.path

    def close(self, timeout_s: float = 10.0) -> RecorderStatus:
        """Write what is queued, finish the file (its summary makes it seekable), and stop."""
        self._queue.close()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return self.status()

    def sync(self, timeout_s: float) -> bool:
        """Wait until every call accepted so far is written and its chunk handed to the OS.

        A process killed after this returns True keeps all of it. For tools and
        tests; the control thread never calls this.
        """
        target = self._queue.counts().accepted
        with self._synced:
            self._sync_wanted = True
            return (
                self._synced.wait_for(
                    lambda: self._durable >= target or self._state is not RecorderState.RECORDING, timeout_s
                )
                and self._durable >= target
            )

    def status(self) -> RecorderStatus:
        counts = self._queue.counts()
        return RecorderStatus(
            state=self._state,
            error=self._error,
            accepted=counts.accepted,
            dropped=counts.dropped,
            dropped_large=counts.dropped_large,
            written=self._written,
            queued_bytes=counts.queued_bytes,
            files=tuple(self._files),
        )

    # -- what the node records (control thread; never blocks) ----------------

    def config(self, t_ns: int, parameters: Mapping[str, Any], versions: Mapping[str, str]) -> None:
        """The resolved parameters and software versions, once at the start (repeated in every rotated file)."""
        text = json.dumps({"parameters": dict(parameters), "versions": dict(versions)}, sort_keys=True, default=str)
        self._put(Kind.CONFIG, -1, t_ns, text, len(text) + _SMALL)

    def observation(self, env: int, t_ns: int, row: ObservationRow, sent_in: Literal["infer", "feedback"]) -> None:
        """One env's observation row as sent in an infer or a feedback.

        With reuse-feedback-obs, an infer that reuses the feedback's row records nothing: readers take
        the feedback's observation for it.
        """
        assert sent_in in channels.SENT_IN, sent_in
        size = _SMALL + sum(a.nbytes for a in row.images.values()) + sum(a.nbytes for a in row.states.values())
        self._put(Kind.OBSERVATION, env, t_ns, (sent_in, row), size)

    def chunk(self, env: int, t_ns: int, action: np.ndarray) -> None:
        """One env's action chunk as received, ``[H, *da]`` (time-major, this env's slice)."""
        self._put(Kind.CHUNK, env, t_ns, action, _SMALL + action.nbytes)

    def step(self, env: int, t_ns: int, chunk_step: int | None, commanded: Mapping[str, np.ndarray | None]) -> None:
        """One control step: which chunk step ran (None: the idle behaviour) and what each sink published.

        ``commanded`` maps a sink's name to the values published after shaping, or None when it
        published nothing.
        """
        size = _SMALL + sum(v.nbytes for v in commanded.values() if v is not None)
        self._put(Kind.STEP, env, t_ns, (chunk_step, dict(commanded)), size)

    def step_result(self, env: int, t_ns: int, reward: float, terminated: bool, truncated: bool, success: bool) -> None:
        """The result of the env's step: its reward (summed over the step's window) and flags."""
        self._put(Kind.STEP_RESULT, env, t_ns, (reward, terminated, truncated, success), _SMALL)

    def episode_end(self, env: int, t_ns: int, ret: float, length: int, success: bool) -> None:
        """An episode ended (terminated or truncated) with this return and length in steps."""
        self._put(Kind.EPISODE, env, t_ns, (ret, length, success), _SMALL)

    def link_event(
        self,
        t_ns: int,
        kind: str,
        epoch: int,
        code: int | None = None,
        reason: str = "",
        dropped_envs: Sequence[int] = (),
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        """A trainer-link event: ``connect``, ``metadata`` (detail: its map), ``close`` (code, reason, and
        the envs whose chunk or held feedback the close dropped), or any other named event."""
        values: dict[str, Any] = {"epoch": epoch}
        if code is not None:
            values["code"] = code
        if reason:
            values["reason"] = reason
        if dropped_envs:
            values["dropped_envs"] = list(dropped_envs)
        if detail:
            values.update(detail)
        level = channels.WARN if kind == "close" else channels.OK
        self._put(Kind.LINK, -1, t_ns, (level, kind, values), _SMALL)

    def latency(self, t_ns: int, seconds: float) -> None:
        """One infer's round trip (sent -> action received)."""
        self._put(Kind.LATENCY, -1, t_ns, seconds, _SMALL)

    def _put(self, kind: Kind, env: int, t_ns: int, payload: Any, size: int) -> None:
        if self._state is RecorderState.RECORDING:
            self._queue.put((kind, env, t_ns, payload), size)

    # -- the writer thread ---------------------------------------------------

    def _open(self, part: int) -> _McapFile:
        assert self.settings.path is not None
        path = self.settings.path / f"{self._stem}_{part}.mcap"
        stream = self._opener(path)
        self._files.append(path)
        return _McapFile(path, stream, self.settings)

    def _run(self) -> None:
        last_chunk_close = time.monotonic()
        try:
            while True:
                batch = self._queue.take_all(self.settings.flush_interval_s)
                if batch is None:
                    break
                for seq, (kind, env, t_ns, payload), size in batch:
                    try:
                        self._write(kind, env, t_ns, seq, payload)
                    finally:
                        self._queue.release(size)
                self._report_drops(final=False)
                assert self._file is not None
                now = time.monotonic()
                if self._sync_wanted or now - last_chunk_close >= self.settings.flush_interval_s:
                    self._file.close_chunk()
                    last_chunk_close = now
                    with self._synced:
                        self._durable = self._written
                        self._sync_wanted = False
                        self._synced.notify_all()
                else:
                    self._file.stream.flush()  # chunks the writer closed by size reach the OS now
            self._report_drops(final=True)
            assert self._file is not None
            self._file.finish()
            self._state = RecorderState.STOPPED
        except Exception as exc:  # the writer's boundary: whatever went wrong stops recording, never the robot
            self._fail(exc)
        with self._synced:
            self._durable = self._written
            self._synced.notify_all()

    def _write(self, kind: Kind, env: int, t_ns: int, seq: int, payload: Any) -> None:
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
        self._written += 1

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
        self._report_drops(final=True)
        self._file.finish()
        self._file = self._open(len(self._files))
        if self._config is not None:  # every file says how the run was configured
            t_ns, seq, text = self._config
            for topic, schema_name, body in channels.messages(Kind.CONFIG, -1, t_ns, text, None):
                self._file.write(topic, schema_name, body, t_ns, seq)

    def _report_drops(self, final: bool) -> None:
        """Put the recorder's own counts in the file: when drops grew, and before a file is finished."""
        counts = self._queue.counts()
        if not final and counts.dropped == self._reported_dropped:
            return
        self._reported_dropped = counts.dropped
        level = channels.WARN if counts.dropped else channels.OK
        values = {"accepted": counts.accepted, "dropped": counts.dropped, "dropped_large": counts.dropped_large}
        message = f"{counts.dropped} call(s) dropped: the writer fell behind" if counts.dropped else "ok"
        assert self._file is not None
        for topic, schema_name, body in channels.messages(
            Kind.RECORDER, -1, self._last_t, (level, message, values), None
        ):
            self._file.write(topic, schema_name, body, self._last_t, 0)

    def _fail(self, exc: Exception) -> None:
        where = f" ({self._file.path})" if self._file is not None else ""
        detail = f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) else str(exc)
        message = f"recording stopped: {detail}{where}; the robot keeps running"
        if self._file is not None:
            try:
                self._file.stream.close()
            except OSError as close_exc:  # a full disk fails the final flush too: say so, keep the first cause
                message += f" (closing the file also failed: {close_exc})"
        self._error = message
        self._state = RecorderState.FAILED
        # Nothing more will be written: let go of what is queued (and of anything put meanwhile).
        self._queue.close()
        while (batch := self._queue.take_all(0.0)) is not None:
            for _, _, size in batch:
                self._queue.release(size)
        if self._on_error is not None:
            self._on_error(message)
