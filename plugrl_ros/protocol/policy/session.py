"""One connection to an openpi-compatible policy server, without I/O: metadata first, one request at a time.

The contract, as openpi's ``WebsocketPolicyServer`` and the servers built
like it deploy it: the server speaks first with one binary msgpack frame
holding a map of metadata (any keys); then the client sends one observation
(a msgpack map, arrays in openpi's ``__ndarray__`` form) and waits for one
answer, a map whose action key holds an array ``[H, action_dim]``. Extra keys
(``server_timing`` and the like) are ignored. A server-side exception arrives
as a text frame with the traceback, then a close with code 1011.

An answer is checked completely before anything is taken from it: a
malformed one raises :class:`ProtocolError` and yields no action at all, so a
server bug can never move a robot.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.errors import ProtocolError, ProtocolMisuse

DEFAULT_ACTION_KEY = "actions"
# Metadata keys some servers use to announce the chunk's shape; when present
# (and integers), answers are checked against them.
HORIZON_KEYS = ("action_horizon",)
WIDTH_KEYS = ("action_dim",)


@dataclass(frozen=True)
class Expectation:
    """What an answer must look like; 0 means "not configured" (then the metadata or first answer decides)."""

    action_key: str = DEFAULT_ACTION_KEY
    horizon: int = 0  # exact H, if the operator knows it
    width: int = 0  # exact action_dim, if the operator knows it
    min_width: int = 0  # what the robot's sinks read: never accept fewer columns

    def __post_init__(self) -> None:
        assert self.action_key, "the action key must not be empty"
        assert self.horizon >= 0 and self.width >= 0 and self.min_width >= 0


@dataclass(frozen=True)
class ServerMetadata:
    """The server's first frame. ``raw`` is whatever it sent; horizon and width are what it announced, if anything."""

    raw: Any
    horizon: int | None
    width: int | None


@dataclass(frozen=True)
class Chunk:
    """A validated answer: finite float64 actions ``[H, action_dim]`` (read-only), and the server's timing if sent."""

    actions: np.ndarray
    server_timing: Mapping[str, Any] | None = None

    @property
    def horizon(self) -> int:
        return int(self.actions.shape[0])


class Phase(enum.Enum):
    AWAIT_METADATA = "waiting for the server's metadata"
    READY = "ready for a request"
    WAITING = "waiting for an answer"
    CLOSED = "closed"


class PolicySession:
    """The rules of one connection; frames in, validated metadata and chunks out."""

    def __init__(self, expect: Expectation) -> None:
        self.expect = expect
        self.phase = Phase.AWAIT_METADATA
        self.metadata: ServerMetadata | None = None
        self.requests = 0
        self.answers = 0
        # the shape answers must have: configured, else announced, else the first answer's
        self._horizon = expect.horizon
        self._width = expect.width

    def request(self, observation: Mapping[str, Any]) -> bytes:
        """The frame for one observation. Only one request may be outstanding."""
        if self.phase is not Phase.READY:
            raise ProtocolMisuse(f"cannot send a request while {self.phase.value}")
        frame = codec.packb(dict(observation))
        self.phase = Phase.WAITING
        self.requests += 1
        return frame

    def receive(self, frame: bytes) -> ServerMetadata | Chunk:
        """Take one binary frame from the server; ProtocolError if it breaks the contract.

        A rejected answer still ends its request (the server will not send
        another for it), so the session is ready for the next one.
        """
        if self.phase is Phase.AWAIT_METADATA:
            return self._metadata(frame)
        if self.phase is not Phase.WAITING:
            self.phase = Phase.CLOSED
            raise ProtocolError(
                "frame", f"the server sent a frame while no request was outstanding ({len(frame)} bytes)"
            )
        self.phase = Phase.READY
        self.answers += 1
        actions, timing = parse_answer(codec.unpackb(frame), self.expect.action_key, self._horizon, self._width)
        if actions.shape[1] < self.expect.min_width:
            raise ProtocolError(
                self.expect.action_key,
                f"has {actions.shape[1]} values per step, but the robot's actions read {self.expect.min_width}",
            )
        # The first valid answer fixes the shape for the rest of the connection:
        # a server whose chunks change shape mid-run is not one to trust.
        self._horizon, self._width = actions.shape
        return Chunk(actions, timing)

    def closed(self) -> None:
        self.phase = Phase.CLOSED

    def _metadata(self, frame: bytes) -> ServerMetadata:
        try:
            raw = codec.unpackb(frame)
        except ProtocolError as exc:
            self.phase = Phase.CLOSED
            raise ProtocolError("metadata", f"the server's first frame is not valid: {exc}") from None
        announced = {"horizon": _announced(raw, HORIZON_KEYS), "width": _announced(raw, WIDTH_KEYS)}
        for what, configured in (("horizon", self.expect.horizon), ("width", self.expect.width)):
            value = announced[what]
            if value is not None and configured and value != configured:
                self.phase = Phase.CLOSED
                raise ProtocolError(
                    "metadata",
                    f"the server announces an action {what} of {value}, but {configured} is configured",
                )
        self._horizon = self._horizon or announced["horizon"] or 0
        self._width = self._width or announced["width"] or 0
        self.metadata = ServerMetadata(raw, announced["horizon"], announced["width"])
        self.phase = Phase.READY
        return self.metadata


def _announced(raw: Any, keys: tuple[str, ...]) -> int | None:
    """A positive integer the metadata announces under one of ``keys``; anything else there is ignored."""
    if not isinstance(raw, Mapping):
        return None
    for key in keys:
        value = raw.get(key)
        if isinstance(value, np.generic):
            value = value.item()
        if type(value) is int and value > 0:
            return value
    return None


def parse_answer(answer: Any, action_key: str, horizon: int = 0, width: int = 0) -> tuple[np.ndarray, Any]:
    """The actions of one decoded answer, as a finite float64 ``[H, D]`` array, and its ``server_timing``.

    ``horizon`` and ``width`` (0: any) are checked exactly. Anything else is a
    ProtocolError naming what is wrong; nothing is taken from a bad answer.
    """
    if not isinstance(answer, Mapping):
        raise ProtocolError("answer", f"must be a map holding {action_key!r}, got {_kind(answer)}")
    if action_key not in answer:
        keys = ", ".join(sorted(repr(k) for k in answer)[:8]) or "none"
        raise ProtocolError(action_key, f"is missing from the answer (its keys: {keys})")
    actions = answer[action_key]
    if not isinstance(actions, np.ndarray):
        raise ProtocolError(action_key, f"must be an array [H, action_dim], got {_kind(actions)}")
    if actions.dtype.kind != "f":
        raise ProtocolError(action_key, f"must hold floats, got dtype {actions.dtype.str}")
    if actions.ndim != 2:
        raise ProtocolError(action_key, f"must be [H, action_dim], got shape {list(actions.shape)}")
    h, d = actions.shape
    if h == 0 or d == 0:
        raise ProtocolError(action_key, f"is empty (shape {list(actions.shape)})")
    if horizon and h != horizon:
        raise ProtocolError(action_key, f"has a horizon of {h} steps, expected {horizon} (shape {[h, d]})")
    if width and d != width:
        raise ProtocolError(action_key, f"has {d} values per step, expected {width} (shape {[h, d]})")
    values = actions.astype(np.float64)  # a copy, native byte order: the wire buffer is not kept
    finite = np.isfinite(values)
    if not finite.all():
        step, column = (int(i) for i in np.argwhere(~finite)[0])
        raise ProtocolError(action_key, f"holds {values[step, column]} at step {step}, value {column}")
    values.flags.writeable = False
    timing = answer.get("server_timing")
    return values, timing if isinstance(timing, Mapping) else None


def _kind(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of shape {list(value.shape)}"
    if isinstance(value, str):
        return f"the string {value[:60]!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return f"a {type(value).__name__}"
