"""A protocol-checking PlugRL trainer for tests: serves one client and reports, clause by clause, what it broke."""

from __future__ import annotations

import argparse
import asyncio
import math
import ssl
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from plugrl_ros.protocol.client import RESYNC_REASON, STOP_REASON
from plugrl_ros.protocol.codec import packb, unpackb
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.messages import (
    ACTION,
    FEEDBACK,
    INFER,
    METADATA,
    REUSE_FEEDBACK_OBS,
    decode_text,
    message_type,
)
from plugrl_ros.tools.serving import serve_trainer

# -- clauses -------------------------------------------------------------------

NO_COMPRESSION = "transport.no-compression"
BINARY_FRAMES = "transport.binary-frames"
WAITS_FOR_METADATA = "handshake.waits-for-metadata"
LARGE_METADATA = "handshake.large-metadata"
ENVELOPE = "message.envelope"
ARRAYS = "message.arrays"
OBSERVATION = "message.observation"
ALTERNATION = "exchange.alternation"
ENV_SETS = "exchange.env-sets"
REUSE = "exchange.reuse"
CHUNK_LENGTH = "probe.chunk-length"
REWARD_SUM = "probe.reward-sum"
TERMINAL_OBSERVATION = "probe.terminal-observation"
TIME_MAJOR = "probe.time-major-order"
RESET_OBSERVATION = "probe.reset-observation"
INFO_EPISODE = "probe.info-episode"
RECONNECTS = "close.reconnects"
STOP_EXITS = "close.stop-exits"
TEXT_FATAL = "close.text-fatal"

CLAUSES: tuple[str, ...] = (
    NO_COMPRESSION,
    BINARY_FRAMES,
    WAITS_FOR_METADATA,
    LARGE_METADATA,
    ENVELOPE,
    ARRAYS,
    OBSERVATION,
    ALTERNATION,
    ENV_SETS,
    REUSE,
    CHUNK_LENGTH,
    REWARD_SUM,
    TERMINAL_OBSERVATION,
    TIME_MAJOR,
    RESET_OBSERVATION,
    INFO_EPISODE,
    RECONNECTS,
    STOP_EXITS,
    TEXT_FATAL,
)

# -- script endings --------------------------------------------------------------

# Endings that close with a code and reason, as the PlugRL server does (docs/protocol.md, Closing).
_CLOSE_ENDINGS: dict[str, tuple[int, str]] = {
    "resync": (1001, RESYNC_REASON),
    "timeout": (1001, "Feedback timeout"),
    "crash": (1011, "Internal server error."),
    "stop": (1001, STOP_REASON),
}
RECONNECT_ENDINGS = ("resync", "timeout", "crash", "drop")
FINAL_ENDINGS = ("stop", "text", "serve")
ENDINGS = RECONNECT_ENDINGS + FINAL_ENDINGS

_ONE_MIB = 1 << 20
_NORMAL_CLOSURE = 1000
# A client speaking first, sending garbage, or losing its place in the
# exchange gets a resync, as a real trainer would give it; a client that does
# it on every connection would loop for ever, so the trainer gives up.
_MAX_CONSECUTIVE_ABORTS = 3
_MAX_STORED_DETAILS = 20
_SHOWN_DETAILS = 5
_CLOSE_TIMEOUT_S = 5.0
_TEXT_FRAME = (
    "Traceback (most recent call last):\n"
    '  File "trainer.py", line 1, in learn\n'
    "RuntimeError: plugrl-test-trainer simulates a server-side failure (script entry 'text')"
)


@dataclass(frozen=True)
class TrainerSettings:
    """What the test trainer announces, how each connection ends, and how long it watches."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0 = pick a free port
    script: tuple[str, ...] = ("resync", "stop")  # one entry per connection: how that connection ends
    feedbacks_per_connection: int = 20  # feedbacks received on a connection before its ending is triggered
    horizon: int = 4  # H of every action chunk
    action_dim: int = 2  # d
    action_dtype: str = "<f4"  # or "<f8"
    features: tuple[str, ...] = ()  # announced in the metadata's "features"
    announce_shape: bool = True  # put action_horizon / action_dim in the metadata
    metadata_delay_s: float = 0.3  # silence expected from the client before the metadata is sent (0: unchecked)
    metadata_padding_bytes: int = 1_100_000  # an extra metadata key the client must ignore; > 1 MiB frame
    probe: bool = True  # the client runs the probe environment: check its semantics
    grace_s: float = 1.5  # after the final ending: how long to watch for forbidden frames / reconnects
    n_envs: int | None = None  # if set, env indices must be < n_envs
    reconnect_window_s: float = 15.0  # how long a client may take to reconnect after a close that asks it to
    tls_cert: str = ""  # PEM certificate chain: serve wss:// (with tls_key)
    tls_key: str = ""

    @property
    def scheme(self) -> str:
        return "wss" if self.tls_cert else "ws"

    def __post_init__(self) -> None:
        object.__setattr__(self, "script", tuple(self.script))
        object.__setattr__(self, "features", tuple(self.features))
        if not self.script:
            raise ValueError("script: give at least one entry, the last being one of " + ", ".join(FINAL_ENDINGS))
        for i, entry in enumerate(self.script):
            if entry not in ENDINGS:
                raise ValueError(f"script[{i}]: {entry!r} is not one of {', '.join(ENDINGS)}")
        for i, entry in enumerate(self.script[:-1]):
            if entry in FINAL_ENDINGS:
                raise ValueError(f"script[{i}]: {entry!r} ends the run, so it can only be the last entry")
        if self.script[-1] not in FINAL_ENDINGS:
            raise ValueError(
                f"script[{len(self.script) - 1}]: the last entry must end the run ({', '.join(FINAL_ENDINGS)}), "
                f"got {self.script[-1]!r}"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is not in 0..65535")
        for name in ("feedbacks_per_connection", "metadata_padding_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)} must not be negative")
        for name in ("horizon", "action_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)} must be at least 1")
        if self.action_dtype not in ("<f4", "<f8"):
            raise ValueError(f"action_dtype: {self.action_dtype!r} is not '<f4' or '<f8'")
        for name in ("metadata_delay_s", "grace_s", "reconnect_window_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: {getattr(self, name)} must be a non-negative number of seconds")
        if self.n_envs is not None and self.n_envs < 1:
            raise ValueError(f"n_envs: {self.n_envs} must be at least 1 (or None for no limit)")


def probe_episode_length(env: int) -> int:
    """L_i of the probe environment: env i terminates when t reaches 3 + 2 * (i % 3).

    Written here rather than imported from the probe client's code: a checker
    that shared its rules with the client under test would share its bugs.
    """
    return 3 + 2 * (env % 3)


def action_chunk(env_indices: Sequence[int], horizon: int, action_dim: int, dtype: str) -> np.ndarray:
    """The chunk answering an infer: ``action[k, row, j] = 10000*k + 10*env_indices[row] + j``.

    Every value names its step, env and dimension, so the probe's ``a`` state in
    a feedback shows which element the client applied last.
    """
    k = np.arange(horizon, dtype=np.float64)[:, None, None]
    envs = np.asarray(env_indices, dtype=np.float64).reshape(1, len(env_indices), 1)
    j = np.arange(action_dim, dtype=np.float64)[None, None, :]
    return (10000.0 * k + 10.0 * envs + j).astype(dtype)


# -- the report ------------------------------------------------------------------


@dataclass(frozen=True)
class ClauseResult:
    """One clause's checks: how many passed, how many failed, and what went wrong (first few)."""

    name: str
    passed: int
    failed: int
    failures: tuple[str, ...]

    @property
    def checks(self) -> int:
        return self.passed + self.failed

    @property
    def status(self) -> str:
        if self.failed:
            return "FAIL"
        return "PASS" if self.passed else "not exercised"


@dataclass(frozen=True)
class Report:
    """The verdict of one run, clause by clause, with notes that are not failures."""

    script: tuple[str, ...]
    connections: int
    clauses: tuple[ClauseResult, ...]
    notes: tuple[str, ...]
    incomplete: str | None  # why the script did not run to its end, if it did not

    def clause(self, name: str) -> ClauseResult:
        for result in self.clauses:
            if result.name == name:
                return result
        raise KeyError(f"no clause named {name!r}; clauses are {', '.join(CLAUSES)}")

    @property
    def passed(self) -> int:
        """The number of clauses that passed (exercised, no failure)."""
        return sum(1 for c in self.clauses if c.status == "PASS")

    @property
    def failed(self) -> int:
        """The number of clauses with at least one failed check."""
        return sum(1 for c in self.clauses if c.status == "FAIL")

    def text(self) -> str:
        lines = [f"plugrl-test-trainer report: script {','.join(self.script)}; {self.connections} connection(s)"]
        width = max(len(name) for name in CLAUSES)
        for c in self.clauses:
            if c.status == "not exercised":
                lines.append(f"----  {c.name:<{width}}  not exercised")
                continue
            counts = (
                f"{c.checks} check{'s' if c.checks != 1 else ''}"
                if not c.failed
                else f"{c.passed} passed, {c.failed} failed"
            )
            lines.append(f"{c.status}  {c.name:<{width}}  ({counts})")
            for detail in c.failures[:_SHOWN_DETAILS]:
                lines.append(f"        - {detail}")
            if c.failed > _SHOWN_DETAILS:
                lines.append(f"        ... and {c.failed - _SHOWN_DETAILS} more")
        if self.incomplete:
            lines.append(f"script incomplete: {self.incomplete}")
        if self.notes:
            lines.append("notes:")
            lines.extend(f"  - {note}" for note in self.notes)
        lines.append(f"{self.passed} passed, {self.failed} failed")
        return "\n".join(lines)


class _Recorder:
    """Counts checks per clause while the run goes on; :meth:`report` takes a snapshot."""

    def __init__(self) -> None:
        self._passed = dict.fromkeys(CLAUSES, 0)
        self._failed = dict.fromkeys(CLAUSES, 0)
        self._details: dict[str, list[str]] = {c: [] for c in CLAUSES}
        self._notes: dict[str, str] = {}
        self.incomplete: str | None = None

    def ok(self, clause: str) -> None:
        self._passed[clause] += 1

    def fail(self, clause: str, detail: str) -> None:
        self._failed[clause] += 1
        if len(self._details[clause]) < _MAX_STORED_DETAILS:
            self._details[clause].append(detail)

    def check(self, clause: str, where: str, problems: Sequence[str]) -> bool:
        """One check of ``clause``: passed when ``problems`` is empty."""
        if problems:
            self.fail(clause, f"{where}: " + "; ".join(problems))
            return False
        self.ok(clause)
        return True

    def note(self, text: str, key: str | None = None) -> None:
        """Something worth knowing that is not a failure; a note with the same key is kept once."""
        self._notes.setdefault(key or text, text)

    def report(self, script: tuple[str, ...], connections: int) -> Report:
        clauses = tuple(ClauseResult(c, self._passed[c], self._failed[c], tuple(self._details[c])) for c in CLAUSES)
        return Report(script, connections, clauses, tuple(self._notes.values()), self.incomplete)


# -- one connection's exchange, without I/O ----------------------------------------


@dataclass(frozen=True)
class _Reply:
    """What the exchange wants sent: an action frame, an abort (resync) with its reason, or nothing."""

    frame: bytes | None = None
    abort: str | None = None


@dataclass(frozen=True)
class _Held:
    """An env's chunk, from the infer that got it until its feedback."""

    action: np.ndarray  # the whole chunk as sent, as float64 [H, n, d]
    row: int
    t: float | None  # the probe's t in that infer; None when it cannot be known
    infer: int


@dataclass(frozen=True)
class _LastFeedback:
    ended: bool | None  # terminated or truncated; None when the flags were unreadable
    t: float | None


@dataclass(frozen=True)
class _Observed:
    problems: list[str]
    rows: int | None  # the common leading dimension, when there is one
    t: np.ndarray | None  # probe states, float64 [rows] and [rows, d], when well-formed
    a: np.ndarray | None
    text_is_list: bool


def _kind_of(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.dtype.str} array of shape {list(value.shape)}"
    return _article(type(value).__name__)


def _array_problem(value: Any, name: str, typestr: str, length: int) -> str | None:
    """Why ``value`` is not a ``typestr`` array of shape [length], or None."""
    if not isinstance(value, np.ndarray):
        return f"{name} must be a {typestr} array of shape [{length}], got {_kind_of(value)}"
    if value.dtype.str != typestr or value.shape != (length,):
        return f"{name} is {_kind_of(value)}, expected {typestr} [{length}]"
    return None


def _indices(value: Any) -> list[int] | None:
    """Env indices we can work with (any 1-d int array), or None."""
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        return [int(v) for v in value.tolist()]
    return None


def _flags(value: Any, m: int) -> np.ndarray | None:
    if isinstance(value, np.ndarray) and value.dtype.kind in "biu" and value.shape == (m,):
        return value.astype(bool)
    return None


def _whole(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x == math.floor(x)


def _fmt(x: float) -> str:
    return f"{x:g}"


def _inspect_observation(obs: Any, action_dim: int, probe: bool) -> _Observed:
    """Check an observation's layout (docs/protocol.md, Messages) and pull out the probe's t and a."""
    problems: list[str] = []
    if not isinstance(obs, dict):
        return _Observed(
            [f"the observation must be a map of images, states, text, got {_kind_of(obs)}"], None, None, None, False
        )
    keys = sorted(str(k) for k in obs)
    if keys != ["images", "states", "text"]:
        problems.append(f"the observation's keys are {keys}, expected exactly images, states, text")
    leading: dict[str, int] = {}
    for group, typestr, ndim, layout in (("images", "|u1", 4, "[n, h, w, c]"), ("states", "<f8", 2, "[n, d]")):
        arrays = obs.get(group, {})
        if not isinstance(arrays, dict):
            problems.append(f"{group} must be a map of name to array, got {_kind_of(arrays)}")
            continue
        for name, array in arrays.items():
            where = f"{group}[{name!r}]"
            if not isinstance(array, np.ndarray):
                problems.append(f"{where} must be a {typestr} array, got {_kind_of(array)}")
                continue
            if array.dtype.str != typestr or array.ndim != ndim:
                problems.append(f"{where} is {_kind_of(array)}, expected {typestr} {layout}")
            if array.ndim >= 1:
                leading[where] = array.shape[0]
    text_is_list = False
    if "text" in obs:
        text = obs["text"]
        count = (
            len(text)
            if isinstance(text, list)
            else (text.shape[0] if isinstance(text, np.ndarray) and text.ndim == 1 else None)
        )
        try:
            decode_text(text, -1 if count is None else count, "text")
        except ProtocolError as exc:
            problems.append(f"{exc} (got {_kind_of(text)})")
        else:
            leading["text"] = count
            text_is_list = isinstance(text, list)
    rows: int | None = None
    if len(set(leading.values())) > 1:
        problems.append(f"leading dimensions differ: {leading}")
    elif leading:
        rows = next(iter(leading.values()))
    t = a = None
    if probe:
        states = obs.get("states") if isinstance(obs.get("states"), dict) else {}
        t_raw, a_raw = states.get("t"), states.get("a")
        if (
            rows is not None
            and isinstance(t_raw, np.ndarray)
            and isinstance(a_raw, np.ndarray)
            and t_raw.dtype.str == "<f8"
            and a_raw.dtype.str == "<f8"
            and t_raw.shape == (rows, 1)
            and a_raw.shape == (rows, action_dim)
        ):
            t, a = t_raw[:, 0].astype(np.float64), a_raw.astype(np.float64)
        else:
            problems.append(f"the probe environment needs states t <f8 [n, 1] and a <f8 [n, {action_dim}]")
    return _Observed(problems, rows, t, a, text_is_list)


class _Exchange:
    """The rules of one connection's exchange, without I/O: a client frame in, what to send out.

    Stream-level violations (a frame that does not decode, a wrong envelope, a
    message out of order) end the connection with a resync, as a PlugRL
    server would. Everything else is recorded and the exchange goes on, so one
    run reports as many distinct problems as possible.
    """

    def __init__(
        self, number: int, settings: TrainerSettings, rec: _Recorder, after_server_close: bool, large_metadata: bool
    ) -> None:
        self.number = number
        self._s = settings
        self._rec = rec
        self._after_server_close = after_server_close
        self._large_metadata = large_metadata
        self._reuse_offered = REUSE_FEEDBACK_OBS in settings.features
        self._expect = INFER
        self._held: dict[int, _Held] = {}
        self._last: dict[int, _LastFeedback] = {}
        self.messages = 0
        self.infers = 0
        self.feedbacks = 0

    def client_closed(self, code: int | None, reason: str) -> None:
        """The client ended the connection; a client that never spoke may have choked on the metadata.

        A normal close (1000) is a client stopping on purpose, which may happen
        at any moment, so it is noted rather than judged.
        """
        if self.messages > 0 or not self._large_metadata:
            return
        if code == _NORMAL_CLOSURE:
            self._rec.note(
                f"connection {self.number}: the client stopped (1000) right after the metadata; "
                f"{LARGE_METADATA} was not judged on it",
                key="stopped-after-metadata",
            )
        else:
            self._rec.fail(
                LARGE_METADATA,
                f"connection {self.number}: the client closed ({_close_text(code, reason)}) before sending "
                f"anything after the metadata frame of more than 1 MiB (a frame size limit?)",
            )

    @property
    def expecting(self) -> str:
        """The message type the exchange expects next: infer or feedback."""
        return self._expect

    def receive(self, frame: bytes | str) -> _Reply:
        self.messages += 1
        where = f"connection {self.number} message {self.messages}"
        if self.messages == 1 and self._large_metadata:
            self._rec.ok(LARGE_METADATA)
        if isinstance(frame, str):
            self._rec.fail(BINARY_FRAMES, f"{where} is a text frame: {frame[:60]!r}")
            return _Reply(abort="a text frame")
        self._rec.ok(BINARY_FRAMES)
        try:
            message = unpackb(frame)
        except ProtocolError as exc:
            clause = ENVELOPE if exc.field == "frame" else ARRAYS
            self._rec.fail(clause, f"{where} does not decode: {exc}")
            return _Reply(abort="an undecodable frame")
        problems = self._envelope_problems(message)
        if not self._rec.check(ENVELOPE, where, problems):
            return _Reply(abort="a malformed message")
        kind = message["message_type"]
        if self.messages == 1 and self._after_server_close:
            # The trainer forgot every env's state with the old connection, so a
            # feedback now describes a transition it can no longer complete.
            if kind != INFER:
                self._rec.fail(
                    RECONNECTS,
                    f"feedback after reconnect: connection {self.number} began with a feedback, "
                    "for an action that arrived on an earlier connection",
                )
                return _Reply(abort="a feedback first after a reconnect")
            self._rec.ok(RECONNECTS)
        if kind != self._expect:
            if self.messages == 1:
                detail = f"connection {self.number} began with a {kind}; the first message on a connection is an infer"
            elif kind == INFER:
                detail = f"{where}: a second infer before the feedback of infer {self.infers}"
            else:
                detail = f"{where}: a feedback with no infer since feedback {self.feedbacks}"
            self._rec.fail(ALTERNATION, detail)
            return _Reply(abort="a message out of order")
        self._rec.ok(ALTERNATION)
        return self._infer(message) if kind == INFER else self._feedback(message)

    def _envelope_problems(self, message: Any) -> list[str]:
        kind = message.get("message_type") if isinstance(message, dict) else None
        try:
            message_type(message, kind if kind in (INFER, FEEDBACK) else self._expect)
        except ProtocolError as exc:
            return [str(exc)]
        missing = [key for key in ("data", "env_indices", "step_ids") if key not in message]
        if missing:
            return [f"the {kind} has no {', '.join(missing)}"]
        if kind == FEEDBACK:
            data = message["data"]
            if not isinstance(data, dict):
                return [f"feedback data must be a map, got {_kind_of(data)}"]
            missing = [key for key in ("obs", "rewards", "terminated", "truncated", "info") if key not in data]
            if missing:
                return [f"feedback data has no {', '.join(missing)}"]
            if not isinstance(data["info"], dict):
                return [f"feedback data.info must be a map, got {_kind_of(data['info'])}"]
        return []

    def _index_problems(self, envs: list[int]) -> list[str]:
        problems = []
        if len(set(envs)) != len(envs):
            problems.append(f"env_indices {envs[:16]} repeat an env")
        negative = [e for e in envs if e < 0]
        if negative:
            problems.append(f"env indices {negative[:8]} are negative")
        if self._s.n_envs is not None:
            beyond = [e for e in envs if e >= self._s.n_envs]
            if beyond:
                problems.append(f"env indices {beyond[:8]} are not below n_envs {self._s.n_envs}")
        return problems

    # -- infer ---------------------------------------------------------------

    def _infer(self, message: dict) -> _Reply:
        self.infers += 1
        where = f"infer {self.infers} on connection {self.number}"
        envs = _indices(message["env_indices"])
        if envs is None:
            self._rec.fail(
                ARRAYS, f"{where}: env_indices must be a <i8 array of shape [n], got {_kind_of(message['env_indices'])}"
            )
            return _Reply(abort="unusable env_indices")
        n = len(envs)
        array_problems = [
            p
            for p in (
                _array_problem(message["env_indices"], "env_indices", "<i8", n),
                _array_problem(message["step_ids"], "step_ids", "<i8", n),
            )
            if p
        ]
        step_ids = _indices(message["step_ids"])
        step_ids = step_ids if step_ids is not None and len(step_ids) == n else None
        reuse: list[bool] | None = None
        if "reuse" in message:
            problem = _array_problem(message["reuse"], "reuse", "|b1", n)
            flags = _flags(message["reuse"], n)
            if problem:
                array_problems.append(problem)
            if flags is None:
                # Without usable flags nobody knows which rows data holds.
                self._rec.check(ARRAYS, where, array_problems)
                return _Reply(abort="unusable reuse flags")
            reuse = flags.tolist()
        self._rec.check(ARRAYS, where, array_problems)

        n_data = n - sum(reuse) if reuse is not None else n
        observed = _inspect_observation(message["data"], self._s.action_dim, self._s.probe)
        obs_problems = list(observed.problems)
        reuse_problems: list[str] = []
        rows_match = observed.rows == n_data
        if observed.rows is not None and not rows_match:
            if reuse is not None:
                reuse_problems.append(f"data has {observed.rows} rows, but reuse leaves {n_data} rows not reused")
            else:
                obs_problems.append(f"data has {observed.rows} rows, env_indices has {n}")
        self._rec.check(OBSERVATION, where, obs_problems)
        if observed.text_is_list:
            self._rec.note(
                "text arrives as a msgpack list of str; the Python reference client sends a <U array", "text"
            )

        if reuse is not None and not self._reuse_offered:
            reuse_problems.insert(0, f"sent a reuse key, but the metadata did not offer {REUSE_FEEDBACK_OBS}")
        if reuse is not None:
            for env, reused in zip(envs, reuse):
                last = self._last.get(env)
                if reused and last is None:
                    reuse_problems.append(f"env {env} is marked reuse but has no feedback on this connection")
                elif reused and last.ended:
                    reuse_problems.append(
                        f"env {env} is marked reuse after a terminal feedback (terminated or truncated): "
                        "its next observation is the reset one"
                    )
        if reuse is not None or not self._reuse_offered:
            self._rec.check(REUSE, where, reuse_problems)

        env_problems = self._index_problems(envs)
        for env in envs:
            if env in self._held:
                env_problems.append(f"env {env} still holds the action of infer {self._held[env].infer}")
        self._rec.check(ENV_SETS, where, env_problems)

        t_infer: list[float | None] = [None] * n
        if self._s.probe and observed.t is not None and rows_match:
            t_infer = self._check_reset_observations(envs, reuse, step_ids, observed.t)

        action = action_chunk(envs, self._s.horizon, self._s.action_dim, self._s.action_dtype)
        values = action.astype(np.float64)
        for row, env in enumerate(envs):
            self._held[env] = _Held(values, row, t_infer[row], self.infers)
        self._expect = FEEDBACK
        reply = {"message_type": ACTION, "data": {"env_ids": np.asarray(envs, dtype="<i8"), "action": action}}
        return _Reply(frame=packb(reply))

    def _check_reset_observations(
        self, envs: list[int], reuse: list[bool] | None, step_ids: list[int] | None, t_data: np.ndarray
    ) -> list[float | None]:
        """probe.reset-observation for each row; returns each row's t (None where unknowable)."""
        t_rows: list[float | None] = []
        data_row = 0
        for row, env in enumerate(envs):
            last = self._last.get(env)
            if reuse is not None and reuse[row]:
                # A reused row's observation is the one its last feedback sent;
                # an illegal reuse was reported above and leaves t unknown.
                t = last.t if last is not None and last.ended is False else None
            else:
                t = float(t_data[data_row])
                data_row += 1
            t_rows.append(t)
            if t is None:
                continue
            length = probe_episode_length(env)
            where = f"env {env} in infer {self.infers} on connection {self.number}"
            step_id = step_ids[row] if step_ids is not None else None
            if last is None:
                ok = _whole(t) and 0 <= t < length
                detail = f"t {_fmt(t)} on its first infer of this connection, expected a whole t in 0..{length - 1}"
            elif last.ended is None or last.t is None:
                continue
            elif last.ended:
                ok = t == 0 and step_id == 0
                detail = (
                    f"t {_fmt(t)}, step_ids {step_id} after a terminal feedback; "
                    "expected the reset observation t 0 and step_ids 0"
                )
            else:
                ok = t == last.t
                detail = (
                    f"t {_fmt(t)}, but its last feedback reported t {_fmt(last.t)} "
                    "(the observation changed between feedback and infer)"
                )
            if ok:
                self._rec.ok(RESET_OBSERVATION)
            else:
                self._rec.fail(RESET_OBSERVATION, f"{where}: {detail}")
        return t_rows

    # -- feedback ------------------------------------------------------------

    def _feedback(self, message: dict) -> _Reply:
        self.feedbacks += 1
        where = f"feedback {self.feedbacks} on connection {self.number}"
        envs = _indices(message["env_indices"])
        if envs is None:
            self._rec.fail(
                ARRAYS, f"{where}: env_indices must be a <i8 array of shape [m], got {_kind_of(message['env_indices'])}"
            )
            return _Reply(abort="unusable env_indices")
        m = len(envs)
        data = message["data"]
        problems = [
            p
            for p in (
                _array_problem(message["env_indices"], "env_indices", "<i8", m),
                _array_problem(message["step_ids"], "step_ids", "<i8", m),
                _array_problem(data["terminated"], "terminated", "|b1", m),
                _array_problem(data["truncated"], "truncated", "|b1", m),
            )
            if p
        ]
        rewards = data["rewards"]
        if isinstance(rewards, np.ndarray) and rewards.dtype.kind == "f" and rewards.shape == (m,):
            if rewards.dtype.str != "<f4":
                self._rec.note(f"rewards arrive as {rewards.dtype.str}; <f4 is the convention (accepted)", "rewards")
            rewards = rewards.astype(np.float64)
        else:
            problems.append(f"rewards must be a float array of shape [{m}], got {_kind_of(rewards)}")
            rewards = None
        self._rec.check(ARRAYS, where, problems)
        terminated = _flags(data["terminated"], m)
        truncated = _flags(data["truncated"], m)

        observed = _inspect_observation(data["obs"], self._s.action_dim, self._s.probe)
        obs_problems = list(observed.problems)
        if observed.rows is not None and observed.rows != m:
            obs_problems.append(f"obs has {observed.rows} rows, env_indices has {m}")
        self._rec.check(OBSERVATION, where, obs_problems)
        if observed.text_is_list:
            self._rec.note(
                "text arrives as a msgpack list of str; the Python reference client sends a <U array", "text"
            )

        env_problems = self._index_problems(envs)
        if m == 0:
            env_problems.append("a feedback must carry at least one env")
        for env in envs:
            if env not in self._held:
                env_problems.append(f"env {env} holds no action (no infer since its last feedback)")
        self._rec.check(ENV_SETS, where, env_problems)

        probe_ok = self._s.probe and observed.t is not None and observed.rows == m
        flags_ok = terminated is not None and truncated is not None
        if self._s.probe and data["info"]:
            self._check_info(where, envs, data["info"], terminated, truncated)
        seen: set[int] = set()
        for row, env in enumerate(envs):
            held = self._held.pop(env, None)
            ended = bool(terminated[row] or truncated[row]) if flags_ok else None
            t = float(observed.t[row]) if probe_ok else None
            if env in seen:
                continue
            seen.add(env)
            self._last[env] = _LastFeedback(ended, t)
            if probe_ok and flags_ok and rewards is not None and held is not None:
                self._check_probe_row(
                    f"env {env} {where}",
                    env,
                    held,
                    t,
                    observed.a[row],
                    float(rewards[row]),
                    bool(terminated[row]),
                    bool(truncated[row]),
                )
        self._expect = INFER
        return _Reply()

    def _check_probe_row(
        self,
        where: str,
        env: int,
        held: _Held,
        t: float,
        a: np.ndarray,
        reward: float,
        terminated: bool,
        truncated: bool,
    ) -> None:
        length = probe_episode_length(env)
        if terminated and t != length:
            hint = " (was the env reset inside its step?)" if t == 0 else ""
            self._rec.fail(
                TERMINAL_OBSERVATION,
                f"{where}: terminated with t {_fmt(t)}, expected the terminal observation t {length}{hint}",
            )
            return  # not the terminal observation: nothing else in this row can be trusted
        if not terminated and t > length:
            self._rec.fail(TERMINAL_OBSERVATION, f"{where}: t {_fmt(t)} ran past the episode's end at t {length}")
            return
        if not terminated and t == length:
            flags = "truncated" if truncated else "neither terminated nor truncated"
            self._rec.fail(
                TERMINAL_OBSERVATION, f"{where}: t reached {length}, the episode's end, but the flags say {flags}"
            )
        else:
            self._rec.ok(TERMINAL_OBSERVATION)
        if held.t is None:
            return
        steps = t - held.t
        horizon = held.action.shape[0]
        if not _whole(t) or not 1 <= steps <= horizon:
            self._rec.fail(
                CHUNK_LENGTH,
                f"{where}: {_fmt(steps)} steps ran (t {_fmt(held.t)} -> {_fmt(t)}), expected 1..{horizon}",
            )
            return
        self._rec.ok(CHUNK_LENGTH)
        s = int(steps)
        if abs(reward - s) <= 1e-4 * s:
            self._rec.ok(REWARD_SUM)
        else:
            hint = " (the last step's reward?)" if reward == 1.0 else ""
            self._rec.fail(REWARD_SUM, f"{where}: reward {_fmt(reward)}, expected the chunk sum {s}.0{hint}")
        expected = held.action[s - 1, held.row]
        if np.allclose(a, expected, rtol=1e-6, atol=1e-6):
            self._rec.ok(TIME_MAJOR)
        else:
            n = held.action.shape[1]
            env_major = held.action.reshape(n, horizon, -1)[held.row, s - 1]
            hint = (
                " (that is an env-major [n, H, d] reading)" if np.allclose(a, env_major, rtol=1e-6, atol=1e-6) else ""
            )
            self._rec.fail(
                TIME_MAJOR,
                f"{where}: a {[_fmt(v) for v in a.tolist()]}, expected action[{s - 1}, row {held.row}] = "
                f"{[_fmt(v) for v in expected.tolist()]}{hint}",
            )

    def _check_info(
        self, where: str, envs: list[int], info: dict, terminated: np.ndarray | None, truncated: np.ndarray | None
    ) -> None:
        m = len(envs)
        problems: list[str] = []
        episode = info.get("episode")
        if not isinstance(episode, dict):
            self._rec.fail(INFO_EPISODE, f"{where}: info is not empty but has no info['episode'] map")
            return
        arrays: dict[str, np.ndarray] = {}
        for key in ("r", "l", "s", "mask"):
            value = episode.get(key)
            if isinstance(value, np.ndarray) and value.shape == (m,) and value.dtype.kind in "biuf":
                arrays[key] = value
            else:
                problems.append(
                    f"info['episode'][{key!r}] must be a numeric array of length {m}, got {_kind_of(value)}"
                )
        if "mask" in arrays and terminated is not None and truncated is not None:
            mask = arrays["mask"].astype(bool)
            ended = terminated | truncated
            if not np.array_equal(mask, ended):
                problems.append(f"mask {mask.tolist()} is not terminated|truncated {ended.tolist()}")
            for row in np.flatnonzero(mask & ended):
                env = envs[row]
                if "l" in arrays and terminated[row]:
                    # Compared with the episode's true end rather than the obs's t,
                    # so a wrong terminal obs is reported once, by its own clause.
                    length = float(arrays["l"][row])
                    if length != probe_episode_length(env):
                        problems.append(
                            f"env {env}: l {_fmt(length)}, but its episode ended at t {probe_episode_length(env)}"
                        )
                if "l" in arrays and "r" in arrays:
                    r, length = float(arrays["r"][row]), float(arrays["l"][row])
                    if abs(r - length) > 1e-3 * max(1.0, length):
                        problems.append(
                            f"env {env}: return r {_fmt(r)}, but l {_fmt(length)} steps earn {_fmt(length)}"
                        )
        self._rec.check(INFO_EPISODE, where, problems)


def _close_text(code: int | None, reason: str) -> str:
    if code is None:
        return "no close frame"
    return f"code {code}" + (f", reason {reason!r}" if reason else "")


def _article(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def _message_type_of(frame: bytes | str) -> str | None:
    """The message_type of a frame, or None when it has none we can read."""
    if isinstance(frame, str):
        return None
    try:
        message = unpackb(frame)
    except ProtocolError:
        return None
    kind = message.get("message_type") if isinstance(message, dict) else None
    return kind if isinstance(kind, str) else None


def _describe_frame(frame: bytes | str) -> str:
    if isinstance(frame, str):
        return f"a text frame {frame[:40]!r}"
    kind = _message_type_of(frame)
    return _article(kind[:40]) if kind is not None else f"a frame of {len(frame)} bytes without a message_type"


# -- the asyncio server ----------------------------------------------------------


@dataclass(eq=False)  # identity: kept in a set until released
class _Link:
    """A client connection handed from the websockets handler to the script driver."""

    number: int
    ws: ServerConnection
    arrived: float
    done: asyncio.Future
    ending: bool = False  # the trainer has started to end it: a new connection now is a reconnect


@dataclass(frozen=True)
class _Outcome:
    kind: str  # "ended", "aborted", "gave-up" or "client-closed"
    how: str  # how the connection closed, for the report
    code: int | None = None


# What the driver waits for after a connection, and for how long.
_FIRST = "first"
_RECONNECT = "reconnect"  # the trainer asked the client to reconnect
_CLIENT_LEFT = "client-left"  # the client left in the middle of the script
_SERVE_LEFT = "serve-left"  # the client left during the final "serve" entry
_STOPPED = "stopped"
_TEXTED = "texted"


class TestTrainer:
    """A PlugRL server that serves one client through a script of endings and checks everything it sends."""

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, settings: TrainerSettings) -> None:
        self.settings = settings
        self._rec = _Recorder()
        metadata: dict[str, Any] = {"protocol_version": 1, "server": "plugrl-test-trainer"}
        if settings.announce_shape:
            metadata["action_horizon"] = settings.horizon
            metadata["action_dim"] = settings.action_dim
        metadata["features"] = list(settings.features)
        if settings.metadata_padding_bytes:
            metadata["padding"] = bytes(settings.metadata_padding_bytes)
        self._metadata_frame = packb({"message_type": METADATA, "data": metadata})
        self._server: Server | None = None
        self._driver: asyncio.Task | None = None
        self._arrivals: asyncio.Queue[_Link] | None = None
        self._current: _Link | None = None  # the newest connection handed to the driver and not yet finished
        self._links: set[_Link] = set()
        self._connections = 0
        self._aborts = 0
        self._over = False

    @property
    def report(self) -> Report:
        return self._rec.report(self.settings.script, self._connections)

    async def start(self) -> int:
        """Start listening; returns the port (useful with port 0)."""
        assert self._server is None, "start() was already called"
        self._arrivals = asyncio.Queue()
        tls = None
        if self.settings.tls_cert:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(self.settings.tls_cert, self.settings.tls_key or None)
        self._server = await serve_trainer(
            self._handle, self.settings.host, self.settings.port, close_timeout=_CLOSE_TIMEOUT_S, tls=tls
        )
        port = next(iter(self._server.sockets)).getsockname()[1]
        self._driver = asyncio.ensure_future(self._drive())
        return port

    async def finished(self, timeout: float | None = None) -> Report:
        """Wait for the script to end (and its grace period), close the server, return the report.

        On timeout the server is closed as well and ``asyncio.TimeoutError``
        is raised; :attr:`report` then holds what was seen so far.
        """
        assert self._driver is not None, "call start() first"
        try:
            await asyncio.wait_for(asyncio.shield(self._driver), timeout)
        except asyncio.TimeoutError:
            self._driver.cancel()
            await asyncio.gather(self._driver, return_exceptions=True)
            self._rec.incomplete = self._rec.incomplete or f"the run did not end within {timeout:g} s"
            raise
        finally:
            await self._shutdown()
        return self.report

    async def _shutdown(self) -> None:
        self._over = True
        for link in list(self._links):
            self._release(link)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    # -- connections arrive ---------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        loop = asyncio.get_running_loop()
        self._connections += 1
        link = _Link(self._connections, ws, loop.time(), loop.create_future())
        if self._over:
            await ws.close(1001, STOP_REASON)
            return
        current = self._current
        # A connection the client is already closing counts as gone: its
        # reconnect may overtake the driver noticing the close.
        if current is not None and not current.ending and current.ws.protocol.state is State.OPEN:
            self._rec.fail(
                RECONNECTS,
                f"connection {link.number} opened while connection {current.number} was still open; "
                "the trainer serves one client at a time",
            )
            await ws.close(1013, "plugrl-test-trainer serves one client at a time")
            return
        self._current = link
        self._links.add(link)
        assert self._arrivals is not None
        self._arrivals.put_nowait(link)
        await link.done

    def _release(self, link: _Link) -> None:
        if not link.done.done():
            link.done.set_result(None)
        self._links.discard(link)
        if self._current is link:
            self._current = None

    async def _next_link(self, timeout: float | None) -> _Link | None:
        assert self._arrivals is not None
        try:
            return await asyncio.wait_for(self._arrivals.get(), timeout)
        except asyncio.TimeoutError:
            return None

    # -- the script -----------------------------------------------------------

    async def _drive(self) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        waits = {
            _FIRST: None,
            _RECONNECT: s.reconnect_window_s,
            _CLIENT_LEFT: s.reconnect_window_s,
            _SERVE_LEFT: s.grace_s,
            _STOPPED: s.grace_s,
            _TEXTED: s.grace_s,
        }
        entry = 0
        state = _FIRST
        previous: tuple[int, str] = (0, "")
        ended_at = loop.time()
        while True:
            link = await self._next_link(waits[state])
            if link is None:
                self._after_silence(state, previous, entry)
                return
            after = link.arrived - ended_at
            try:
                if state in (_STOPPED, _TEXTED):
                    clause, rule = (STOP_EXITS, "stop close") if state == _STOPPED else (TEXT_FATAL, "text frame")
                    self._rec.fail(
                        clause,
                        f"the client reconnected (connection {link.number}) {after:.2f} s after the {rule} "
                        f"of connection {previous[0]}",
                    )
                    await link.ws.close(1001, STOP_REASON)
                    return
                outcome = await self._serve(link, s.script[entry], after_server_close=state == _RECONNECT)
            finally:
                self._release(link)
            ended_at = loop.time()
            previous = (link.number, outcome.how)
            if outcome.kind == "ended":
                self._aborts = 0
                ending = s.script[entry]
                if ending in RECONNECT_ENDINGS:
                    entry += 1
                    state = _RECONNECT
                else:
                    state = _STOPPED if ending == "stop" else _TEXTED
            elif outcome.kind == "aborted":
                state = _RECONNECT
            elif outcome.kind == "gave-up":
                self._rec.incomplete = (
                    f"gave up after {_MAX_CONSECUTIVE_ABORTS} consecutive connections ended by protocol violations"
                )
                return
            elif s.script[entry] == "serve":
                if outcome.code != 1000:
                    self._rec.note(
                        f"the client closed connection {link.number} with {outcome.how}; "
                        "a client that stops should close with code 1000"
                    )
                state = _SERVE_LEFT
            else:
                self._rec.note(
                    f"the client closed connection {link.number} itself ({outcome.how}) "
                    f"before the trainer ended it with {s.script[entry]!r}"
                )
                state = _CLIENT_LEFT

    def _after_silence(self, state: str, previous: tuple[int, str], entry: int) -> None:
        """No new connection came while the driver waited after ``state``."""
        s = self.settings
        number, how = previous
        if state == _RECONNECT:
            self._rec.fail(
                RECONNECTS, f"no reconnect within {s.reconnect_window_s:g} s after connection {number} closed ({how})"
            )
            self._rec.incomplete = f"entries not run: {', '.join(s.script[entry:])}"
        elif state == _CLIENT_LEFT:
            self._rec.incomplete = (
                f"the client left connection {number} ({how}) and did not come back within "
                f"{s.reconnect_window_s:g} s; entries not run: {', '.join(s.script[entry:])}"
            )
        elif state == _STOPPED:
            self._rec.ok(STOP_EXITS)
        elif state == _TEXTED:
            self._rec.ok(TEXT_FATAL)

    async def _serve(self, link: _Link, ending: str, after_server_close: bool) -> _Outcome:
        s = self.settings
        ws = link.ws
        loop = asyncio.get_running_loop()
        self._check_compression(link)
        if s.metadata_delay_s > 0:
            try:
                early = await asyncio.wait_for(ws.recv(), s.metadata_delay_s)
            except asyncio.TimeoutError:
                self._rec.ok(WAITS_FOR_METADATA)
            except ConnectionClosed as exc:
                return self._client_closed(exc, None)
            else:
                self._rec.fail(
                    WAITS_FOR_METADATA,
                    f"connection {link.number}: the client sent {_describe_frame(early)} "
                    f"{loop.time() - link.arrived:.2f} s after the handshake, before the metadata",
                )
                return await self._abort(link, "a frame before the metadata")
        try:
            await ws.send(self._metadata_frame)
        except ConnectionClosed as exc:
            return self._client_closed(exc, None)
        exchange = _Exchange(
            link.number, s, self._rec, after_server_close, large_metadata=len(self._metadata_frame) > _ONE_MIB
        )
        while True:
            try:
                frame = await ws.recv()
            except ConnectionClosed as exc:
                return self._client_closed(exc, exchange)
            reply = exchange.receive(frame)
            if reply.abort is not None:
                return await self._abort(link, reply.abort)
            if reply.frame is None:
                continue
            try:
                await ws.send(reply.frame)
            except ConnectionClosed as exc:
                return self._client_closed(exc, exchange)
            # The ending comes right after an action, while the client holds
            # it: that is when a close or a crash hurts a client the most.
            if ending != "serve" and exchange.feedbacks >= s.feedbacks_per_connection:
                return await self._end(link, ending, exchange)

    def _check_compression(self, link: _Link) -> None:
        request = link.ws.request
        offers = request.headers.get_all("Sec-WebSocket-Extensions") if request is not None else []
        deflate = [offer for offer in offers if "permessage-deflate" in offer.lower()]
        problems = (
            [f"the handshake offered compression (Sec-WebSocket-Extensions: {deflate[0][:80]})"] if deflate else []
        )
        self._rec.check(NO_COMPRESSION, f"connection {link.number}", problems)

    def _client_closed(self, exc: ConnectionClosed, exchange: _Exchange | None) -> _Outcome:
        code = exc.rcvd.code if exc.rcvd is not None else None
        reason = exc.rcvd.reason if exc.rcvd is not None else ""
        if exchange is not None:
            exchange.client_closed(code, reason)
        return _Outcome("client-closed", _close_text(code, reason), code)

    async def _abort(self, link: _Link, why: str) -> _Outcome:
        link.ending = True
        self._aborts += 1
        if self._aborts >= _MAX_CONSECUTIVE_ABORTS:
            await link.ws.close(1001, STOP_REASON)
            return _Outcome("gave-up", f"{_close_text(1001, STOP_REASON)} after {why}")
        await link.ws.close(1001, RESYNC_REASON)
        return _Outcome("aborted", f"{_close_text(1001, RESYNC_REASON)} after {why}")

    async def _end(self, link: _Link, ending: str, exchange: _Exchange) -> _Outcome:
        link.ending = True
        if ending in _CLOSE_ENDINGS:
            code, reason = _CLOSE_ENDINGS[ending]
            await link.ws.close(code, reason)
            return _Outcome("ended", _close_text(code, reason))
        if ending == "drop":
            # No close frame at all: what a crashed host or a cut cable looks like.
            link.ws.transport.abort()
            return _Outcome("ended", "dropped without a close frame")
        assert ending == "text", ending
        await self._text_ending(link, exchange)
        return _Outcome("ended", "a text frame")

    async def _text_ending(self, link: _Link, exchange: _Exchange) -> None:
        """Send a text frame and watch: the client must send nothing more and close."""
        ws = link.ws
        loop = asyncio.get_running_loop()
        try:
            await ws.send(_TEXT_FRAME)
        except ConnectionClosed:
            return
        deadline = loop.time() + self.settings.grace_s
        # A client that has not read the text frame yet may still send the
        # feedback of the action just sent and then its next infer: neither
        # proves it ignored the text frame. Anything after those two does.
        in_flight = [FEEDBACK, INFER]
        extra: list[str] = []
        closed = False
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                frame = await asyncio.wait_for(ws.recv(), remaining)
            except asyncio.TimeoutError:
                break
            except ConnectionClosed:
                closed = True
                break
            if not extra and in_flight and _message_type_of(frame) == in_flight[0] == exchange.expecting:
                self._rec.note(
                    f"{_article(in_flight[0])} crossed the text frame on connection {link.number} "
                    "(sent before the client could have read it); accepted",
                    f"crossed {in_flight[0]}",
                )
                in_flight.pop(0)
                exchange.receive(frame)  # checked like any other message; the trainer answers nothing now
                continue
            in_flight.clear()
            extra.append(_describe_frame(frame))
        where = f"connection {link.number}"
        problems = (
            [f"the client sent {len(extra)} more frame(s) after the text frame, first {extra[0]}"] if extra else []
        )
        self._rec.check(TEXT_FATAL, where, problems)
        grace = self.settings.grace_s
        self._rec.check(
            TEXT_FATAL,
            where,
            [] if closed else [f"the client had not closed the connection {grace:g} s after the text frame"],
        )
        if not closed:
            await ws.close(1001, STOP_REASON)


async def run_trainer(settings: TrainerSettings, ready: Callable[[int], None] | None = None) -> Report:
    """Run the test trainer until its script ends; ``ready`` gets the port once it listens."""
    trainer = TestTrainer(settings)
    port = await trainer.start()
    if ready is not None:
        ready(port)
    return await trainer.finished()


# -- command line ----------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    d = TrainerSettings()
    p = argparse.ArgumentParser(
        prog="plugrl-test-trainer",
        description="A PlugRL trainer that checks its one client against the protocol and reports, clause by clause.",
    )
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port, help="0 picks a free port")
    p.add_argument(
        "--script",
        default=",".join(d.script),
        help=f"how each connection ends, comma-separated ({', '.join(ENDINGS)}); the last one ends the run",
    )
    p.add_argument("--feedbacks", type=int, default=d.feedbacks_per_connection, help="feedbacks per connection")
    p.add_argument("--horizon", type=int, default=d.horizon)
    p.add_argument("--action-dim", type=int, default=d.action_dim)
    p.add_argument("--dtype", choices=("f4", "f8"), default="f4", help="action dtype")
    p.add_argument("--features", default="", help=f"comma-separated, e.g. {REUSE_FEEDBACK_OBS}")
    p.add_argument(
        "--no-announce-shape", action="store_true", help="leave action_horizon/action_dim out of the metadata"
    )
    p.add_argument("--no-probe", action="store_true", help="the client does not run the probe environment")
    p.add_argument("--n-envs", type=int, default=None)
    p.add_argument("--metadata-delay", type=float, default=d.metadata_delay_s)
    p.add_argument("--grace", type=float, default=d.grace_s)
    p.add_argument("--reconnect-window", type=float, default=d.reconnect_window_s)
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (exit code 2)")
    p.add_argument("--tls-cert", default="", help="PEM certificate (chain) to serve wss:// instead of ws://")
    p.add_argument("--tls-key", default="", help="PEM private key for --tls-cert (if not in the same file)")
    return p


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def _run_cli(settings: TrainerSettings, timeout: float | None, keep: Callable[[TestTrainer], None]) -> int:
    trainer = TestTrainer(settings)
    keep(trainer)
    try:
        port = await trainer.start()
    except OSError as exc:
        print(f"plugrl-test-trainer: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 2
    print(f"listening on {settings.scheme}://{_url_host(settings.host)}:{port}", flush=True)
    try:
        report = await trainer.finished(timeout)
    except asyncio.TimeoutError:
        print(trainer.report.text(), flush=True)
        return 2
    print(report.text(), flush=True)
    # a script the client did not let run to its end proves nothing: fail it
    return 1 if report.failed or report.incomplete else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``plugrl-test-trainer``: 0 if no clause failed, 1 if one did (or the script did not finish), 2 on --timeout."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        settings = TrainerSettings(
            host=args.host,
            port=args.port,
            script=_split(args.script),
            feedbacks_per_connection=args.feedbacks,
            horizon=args.horizon,
            action_dim=args.action_dim,
            action_dtype="<" + args.dtype,
            features=_split(args.features),
            announce_shape=not args.no_announce_shape,
            probe=not args.no_probe,
            n_envs=args.n_envs,
            metadata_delay_s=args.metadata_delay,
            grace_s=args.grace,
            reconnect_window_s=args.reconnect_window,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
        )
    except ValueError as exc:
        parser.error(str(exc))
    trainers: list[TestTrainer] = []
    try:
        return asyncio.run(_run_cli(settings, args.timeout, trainers.append))
    except KeyboardInterrupt:
        # Interrupted: what was seen so far is still worth printing.
        if trainers:
            print(trainers[0].report.text(), flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
