"""The recorder: a small typed API the control thread calls, and a writer process that makes MCAP of it.

It observes and never steers. Every call only puts a reference on a
bounded queue (:class:`DropQueue`) and returns. A forwarding thread
serializes what is queued to a writer process
(:mod:`plugrl_ros.record.writer_process`), which converts to ROS messages,
compresses and writes: the heavy, pure-Python MCAP work never competes with
the control loop for this interpreter. When the writer falls behind, calls
are dropped and counted; when writing fails (a full disk, a removed drive)
recording stops with an error state that the node shows on /diagnostics
and in its log: nothing here ever raises into the caller after
:meth:`Recorder.start`. Given an ``opener``, the writing happens on a thread
of this process instead (tests and tools inject streams that way).

Arrays handed to a call are kept by reference until written: the caller
must not modify them in place afterwards (the bridge never does: every
observation, chunk and command is a fresh array).
"""

from __future__ import annotations

import datetime
import itertools
import json
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import numpy as np

from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.record import channels, schemas, writer_process
from plugrl_ros.record.channels import Intervention, Kind
from plugrl_ros.record.drop_queue import DropQueue
from plugrl_ros.record.settings import RecordSettings
from plugrl_ros.thread_guard import Crash, guarded, log_crash

if TYPE_CHECKING:
    # mcap is imported only where files are written, so a bridge that does not record starts
    # on a robot without it (there is no apt package; it is a pip install).
    from plugrl_ros.record.writer import Opener, RunWriter

_SMALL = 256  # bytes a call's Python objects weigh beyond its arrays (a rough, conservative figure)
_START_TIMEOUT_S = 60.0


def plain(value: Any) -> Any:
    """``value`` as JSON and the wire codec carry it: maps, lists, strings, numbers (a server's metadata may
    hold numpy values or bytes; an unreadable value becomes its text rather than stop the recording)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= 64 else f"<array {value.dtype} {list(value.shape)}>"
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)


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


class Recorder:
    """Record one run into ``settings.path``; every method but :meth:`start` and :meth:`close` never blocks.

    Times are integer nanoseconds of the caller's clock (the node's ROS clock,
    so sim time when ``use_sim_time`` is set): each message is stamped with
    the time its event happened, not the time it was written.
    """

    def __init__(
        self,
        settings: RecordSettings,
        on_error: Callable[[str], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
        opener: Opener | None = None,
        on_crash: Callable[[Crash], None] = log_crash,
    ) -> None:
        """``on_error``: told why recording stopped (a full disk, the writer process gone: the robot keeps
        running). ``on_crash``: told if a recorder thread dies of an error nobody expected (see
        :mod:`plugrl_ros.thread_guard`): the recording stops too, and the process is to exit."""
        assert settings.path is not None, "a Recorder needs record.path"
        self.settings = settings
        self._on_error = on_error
        self._on_crash = on_crash
        self._wall_clock = wall_clock
        self._opener = opener  # None: write in a writer process
        # (kind, env, t_ns, payload); the queue numbers every call, dropped or not: the MCAP sequence
        self._queue: DropQueue[tuple[Kind, int, int, Any]] = DropQueue(settings.queue_bytes)
        self._state = RecorderState.OFF
        self._error = ""
        self._written = 0
        self._files: list[Path] = []
        self._durable = 0  # calls written whose chunk has reached the OS
        self._sync_wanted = False
        self._synced = threading.Condition()
        self._writer: RunWriter | None = None  # in this process
        self._child: subprocess.Popen | None = None  # or in a writer process
        self._threads: list[threading.Thread] = []

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
        started = datetime.datetime.fromtimestamp(self._wall_clock(), tz=datetime.timezone.utc)
        base = "plugrl_" + started.strftime("%Y_%m_%d-%H_%M_%S")
        stem = base
        for attempt in itertools.count(1):
            if not any(folder.glob(f"{stem}_*.mcap")):
                break
            stem = f"{base}-{attempt}"
        if self._opener is not None:
            first = self._start_thread(stem)
        else:
            first = self._start_process(stem)
        self._state = RecorderState.RECORDING
        for thread in self._threads:
            thread.start()
        return first

    def _start_thread(self, stem: str) -> Path:
        assert self._opener is not None
        from plugrl_ros.record.writer import RunWriter

        self._writer = RunWriter(self.settings, stem, self._opener, on_open=self._files.append)
        try:
            first = self._writer.open_first()
        except OSError as exc:
            raise RecordError(f"record.path: cannot write a recording in {self.settings.path}: {exc}") from None
        self._threads = [self._thread(self._write_here, "plugrl-recorder")]
        return first

    def _start_process(self, stem: str) -> Path:
        self._child = subprocess.Popen(
            [sys.executable, "-m", writer_process.__name__, writer_process.settings_to_json(self.settings), stem],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # its own tracebacks, if any, go where the bridge's own output goes
        )
        assert self._child.stdout is not None
        ready, _, _ = select.select([self._child.stdout], [], [], _START_TIMEOUT_S)
        line = self._child.stdout.readline() if ready else b""
        event = json.loads(line) if line else {"failed": "the writer process did not start"}
        if "file" not in event:
            self._child.kill()
            self._child.wait()
            raise RecordError(f"record.path: cannot write a recording in {self.settings.path}: {event['failed']}")
        self._files.append(Path(event["file"]))
        self._threads = [
            self._thread(self._forward, "plugrl-recorder"),
            self._thread(self._listen, "plugrl-recorder-reports"),
        ]
        return self._files[0]

    def _thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        """A recorder thread behind the last line of defence."""
        return threading.Thread(target=guarded(target, f"recorder ({name})", self._crashed), name=name, daemon=True)

    def _crashed(self, crash: Crash) -> None:
        self._fail(f"recording stopped: the {crash.thread} thread died ({crash.error})")
        self._on_crash(crash)

    def close(self, timeout_s: float = 10.0) -> RecorderStatus:
        """Write what is queued, finish the file (its summary makes it seekable), and stop."""
        self._queue.close()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout_s)
        if self._child is not None and self._child.poll() is None:
            try:
                self._child.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
                self._fail(f"the writer process did not finish within {timeout_s:g} s and was killed")
        return self.status()

    def sync(self, timeout_s: float) -> bool:
        """Wait until every call accepted so far is written and its chunk handed to the OS.

        A process killed after this returns True keeps all of it. For tools and
        tests; the control thread never calls this.
        """
        target = self._queue.counts().accepted
        with self._synced:
            self._sync_wanted = True
        self._queue.wake()
        with self._synced:
            return (
                self._synced.wait_for(
                    lambda: self._durable >= target or self._state is not RecorderState.RECORDING, timeout_s
                )
                and self._durable >= target
            )

    @property
    def writer_pid(self) -> int | None:
        """The writer process's id (None when writing in this process)."""
        return self._child.pid if self._child is not None else None

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

    def step(
        self,
        env: int,
        t_ns: int,
        chunk_step: int | None,
        commanded: Mapping[str, np.ndarray | None],
        applied: np.ndarray | None = None,
        intervention: Intervention | None = None,
    ) -> None:
        """One control step: which chunk step ran (None: the idle behaviour) and what each sink published.

        ``commanded`` maps a sink's name to the values published after shaping, or None when it
        published nothing. ``applied`` (deploy mode) is the action the step applied before shaping,
        when it is not simply row ``chunk_step`` of the last chunk (a blend of several chunks).
        ``intervention`` (with a person in the loop): whether a person commanded the step, whether the
        policy's action was replaced (by the person's command, or by an idle while the robot waited for a
        chunk that fits its state), and the person's command (action units, before shaping).
        """
        size = _SMALL + sum(v.nbytes for v in commanded.values() if v is not None)
        if applied is not None:
            size += applied.nbytes
        if intervention is not None and intervention[2] is not None:
            size += intervention[2].nbytes
        self._put(Kind.STEP, env, t_ns, (chunk_step, dict(commanded), applied, intervention), size)

    def answer(
        self,
        env: int,
        t_ns: int,
        outcome: str,
        request: int,
        round_trip_s: float | None = None,
        first_row: int | None = None,
        server_timing: Mapping[str, Any] | None = None,
        detail: str = "",
    ) -> None:
        """Deploy mode: what became of the policy server's answer to ``request`` (see channels.ANSWER_OUTCOMES).

        ``first_row``: for an applied chunk, the row that runs first (the rows before it were meant
        for ticks that passed while the answer travelled: the alignment).
        """
        assert outcome in channels.ANSWER_OUTCOMES, outcome
        values: dict[str, Any] = {"request": request}
        if round_trip_s is not None:
            values["round_trip_s"] = round_trip_s
        if first_row is not None:
            values["first_row"] = first_row
        if server_timing:
            values["server_timing"] = plain(server_timing)
        if detail:
            values["detail"] = detail
        self._put(Kind.ANSWER, env, t_ns, (outcome, values), _SMALL + len(detail))

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
            values.update(plain(detail))
        level = channels.WARN if kind in ("close", "traceback") else channels.OK
        self._put(Kind.LINK, -1, t_ns, (level, kind, values), _SMALL)

    def latency(self, t_ns: int, seconds: float) -> None:
        """One infer's round trip (sent -> action received)."""
        self._put(Kind.LATENCY, -1, t_ns, seconds, _SMALL)

    def _put(self, kind: Kind, env: int, t_ns: int, payload: Any, size: int) -> None:
        if self._state is RecorderState.RECORDING:
            self._queue.put((kind, env, t_ns, payload), size)

    # -- writing here (a thread) --------------------------------------------

    def _write_here(self) -> None:
        writer = self._writer
        assert writer is not None
        last_chunk_close = time.monotonic()
        try:
            while True:
                batch = self._queue.take_all(self.settings.flush_interval_s)
                if batch is None:
                    break
                for seq, (kind, env, t_ns, payload), size in batch:
                    try:
                        writer.write(kind, env, t_ns, seq, payload)
                    finally:
                        self._queue.release(size)
                self._written = writer.written
                counts = self._queue.counts()
                writer.counts(counts.accepted, counts.dropped, counts.dropped_large)
                writer.report_drops(final=False)
                now = time.monotonic()
                if self._sync_wanted or now - last_chunk_close >= self.settings.flush_interval_s:
                    writer.close_chunk()
                    last_chunk_close = now
                    self._set_durable(writer.written)
                else:
                    writer.flush()  # chunks the writer closed by size reach the OS now
            counts = self._queue.counts()
            writer.counts(counts.accepted, counts.dropped, counts.dropped_large)
            writer.finish()
            self._written = writer.written
            self._state = RecorderState.STOPPED
        except Exception as exc:  # the writer's boundary: whatever went wrong stops recording, never the robot
            self._fail(writer.failure(exc))
        self._set_durable(writer.written)

    # -- writing in a writer process ---------------------------------------------

    def _forward(self) -> None:
        """Hand each queued call to the writer process (blocking here, on a full pipe, is the point)."""
        child = self._child
        assert child is not None and child.stdin is not None
        pipe = child.stdin
        try:
            while True:
                batch = self._queue.take_all(self.settings.flush_interval_s)
                if batch is None:
                    break
                for seq, (kind, env, t_ns, payload), size in batch:
                    try:
                        wire = writer_process.to_wire(kind, payload)
                        pipe.write(writer_process.frame([writer_process.ITEM, seq, kind.value, env, t_ns, wire]))
                    finally:
                        self._queue.release(size)
                self._send_counts(pipe)
                if self._sync_wanted:  # until sync() has what it waits for
                    pipe.write(writer_process.frame([writer_process.SYNC]))
                pipe.flush()
            self._send_counts(pipe)
            pipe.close()  # the end of the run: the writer process finishes the file
        except (OSError, ValueError) as exc:  # the writer process is gone (a broken pipe): it says why, or _listen does
            self._discard_queue()
            if self._state is RecorderState.RECORDING:
                self._fail(f"recording stopped: the writer process stopped reading ({exc}); the robot keeps running")

    def _send_counts(self, pipe: IO[bytes]) -> None:
        counts = self._queue.counts()
        pipe.write(
            writer_process.frame([writer_process.BATCH_END, counts.accepted, counts.dropped, counts.dropped_large])
        )

    def _listen(self) -> None:
        """Follow the writer process's reports until it exits."""
        child = self._child
        assert child is not None and child.stdout is not None
        stopped = False
        for line in child.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                self._fail(f"recording stopped: the writer process said something unexpected: {line[:200]!r}")
                break
            if "file" in event:
                self._files.append(Path(event["file"]))
            if "written" in event:
                self._written = event["written"]
            if "durable" in event:
                self._set_durable(event["durable"])
            if "failed" in event:
                self._fail(event["failed"])
            if event.get("stopped"):
                stopped = True
        code = child.wait()
        if stopped and self._state is RecorderState.RECORDING:
            self._state = RecorderState.STOPPED
        elif self._state is RecorderState.RECORDING:
            self._fail(
                f"recording stopped: the writer process exited unexpectedly (code {code}); the robot keeps running"
            )
        self._set_durable(self._durable)

    # -- shared ----------------------------------------------------------------

    def _set_durable(self, count: int) -> None:
        with self._synced:
            self._durable = count
            self._synced.notify_all()

    def _discard_queue(self) -> None:
        """Nothing more will be written: let go of what is queued (and of anything put meanwhile)."""
        self._queue.close()
        while (batch := self._queue.take_all(0.0)) is not None:
            for _, _, size in batch:
                self._queue.release(size)

    def _fail(self, message: str) -> None:
        if self._state is RecorderState.FAILED:
            return
        self._error = message
        self._state = RecorderState.FAILED
        self._discard_queue()
        if self._child is not None and self._child.poll() is None:
            self._child.kill()  # it failed (and said so) or stopped reading: nothing more will reach the file
        if self._on_error is not None:
            self._on_error(message)
        with self._synced:
            self._synced.notify_all()
