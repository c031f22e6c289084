"""The rules of one PlugRL connection, as a sans-I/O state machine.

No sockets and no event loop: :meth:`Connection.receive` takes a frame and
returns what it meant, :meth:`Connection.infer` and
:meth:`Connection.feedback` return a message ready to encode. Everything
the protocol asks of a client (docs/protocol.md) that can be decided from
the stream lives here: metadata first, strict infer/feedback alternation,
which envs may appear in which message, and when an observation may be
reused. Our own code breaking a rule raises :class:`ProtocolMisuse` before
a byte is produced, because a broken stream costs the trainer its per-env
state (a resync) and the robot its running chunks.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.errors import FatalServerError, ProtocolError, ProtocolMisuse
from plugrl_ros.protocol.messages import (
    REUSE_FEEDBACK_OBS,
    ActionChunk,
    Metadata,
    ObservationRow,
    TextFormat,
    batch_rows,
    build_feedback,
    build_infer,
    parse_action,
    parse_metadata,
)


class Phase(enum.Enum):
    """What the connection expects next."""

    AWAIT_METADATA = "await metadata"  # the server speaks first
    INFER = "infer"  # our turn: an infer
    AWAIT_ACTION = "await action"  # the trainer's turn: an action
    FEEDBACK = "feedback"  # our turn: a feedback
    CLOSED = "closed"


class _SameAsFeedback:
    def __repr__(self) -> str:
        return "SAME_AS_FEEDBACK"


SAME_AS_FEEDBACK: Any = _SameAsFeedback()
"""Pass as an infer row: "the observation my last feedback sent for this env"."""


@dataclass
class Outgoing:
    """A message the rules allowed; :meth:`encode` does the heavy work in the I/O thread."""

    kind: str
    env_indices: tuple[int, ...]
    _build: Any  # callable returning the message map

    def encode(self) -> bytes:
        return codec.packb(self._build())

    def message(self) -> dict:
        return self._build()


class Connection:
    """One connection's protocol state, from the env client's side."""

    def __init__(self, *, use_reuse: bool = True, text_format: TextFormat = "array") -> None:
        self.phase = Phase.AWAIT_METADATA
        self.metadata: Metadata | None = None
        self._use_reuse = use_reuse
        self._text_format = text_format
        self._inflight: tuple[int, ...] = ()
        # envs that received an action and have not been fed back yet
        self.holding: set[int] = set()
        # env -> the row its last feedback on this connection sent, if not terminal
        self._server_holds: dict[int, ObservationRow] = {}

    # -- receiving -------------------------------------------------------

    def receive(self, frame: bytes | str) -> Metadata | ActionChunk:
        """Decode and validate a frame from the trainer (ProtocolError if it is malformed)."""
        if isinstance(frame, str):
            self.phase = Phase.CLOSED
            raise FatalServerError(f"the trainer sent a text frame: {frame[:200]!r}")
        if self.phase is Phase.AWAIT_METADATA:
            self.metadata = parse_metadata(codec.unpackb(frame))
            self.phase = Phase.INFER
            return self.metadata
        if self.phase is Phase.AWAIT_ACTION:
            chunk = parse_action(codec.unpackb(frame), self._inflight)
            self.holding.update(self._inflight)
            self._inflight = ()
            self.phase = Phase.FEEDBACK
            return chunk
        raise ProtocolError("frame", f"unexpected: the trainer spoke while the client's turn was {self.phase.value!r}")

    # -- sending ---------------------------------------------------------

    @property
    def reuse_offered(self) -> bool:
        return self.metadata is not None and REUSE_FEEDBACK_OBS in self.metadata.features

    def may_reuse(self, env: int) -> bool:
        """Whether the trainer holds an observation of ``env`` a new chunk may start from."""
        return env in self._server_holds

    def infer(self, env_indices: Sequence[int], step_ids: Sequence[int], rows: Sequence[Any]) -> Outgoing:
        """An infer for envs holding no action; a row may be :data:`SAME_AS_FEEDBACK`."""
        self._expect(Phase.INFER, "infer")
        envs = self._check_envs(env_indices, step_ids, rows, "infer")
        if not envs:
            raise ProtocolMisuse("an infer must carry at least one env")
        for env in envs:
            if env in self.holding:
                raise ProtocolMisuse(f"env {env} is in an infer while it still holds an action")
        reuse = [row is SAME_AS_FEEDBACK for row in rows]
        for env, reused in zip(envs, reuse):
            if reused and env not in self._server_holds:
                raise ProtocolMisuse(
                    f"env {env}: no reusable observation (no feedback on this connection, or it was terminal)"
                )
        send_reuse = self._use_reuse and self.reuse_offered and any(reuse)
        held = dict(self._server_holds)
        if send_reuse:
            sent = [row for row, reused in zip(rows, reuse) if not reused]
            template = held[envs[reuse.index(True)]]
        else:
            sent = [held[env] if reused else row for env, row, reused in zip(envs, rows, reuse)]
            template = None
        steps = tuple(int(s) for s in step_ids)
        text_format = self._text_format

        def build() -> dict:
            observation = batch_rows(sent, text_format, template)
            return build_infer(envs, steps, observation, reuse if send_reuse else None)

        self._inflight = envs
        self.phase = Phase.AWAIT_ACTION
        return Outgoing(kind="infer", env_indices=envs, _build=build)

    def feedback(
        self,
        env_indices: Sequence[int],
        step_ids: Sequence[int],
        rows: Sequence[ObservationRow],
        rewards: Sequence[float],
        terminated: Sequence[bool],
        truncated: Sequence[bool],
        info: Mapping[str, Any],
    ) -> Outgoing:
        """A feedback for envs holding an action: their chunks' sums and last observations."""
        self._expect(Phase.FEEDBACK, "feedback")
        envs = self._check_envs(env_indices, step_ids, rows, "feedback")
        if not envs:
            raise ProtocolMisuse("a feedback must carry at least one env")
        for env in envs:
            if env not in self.holding:
                raise ProtocolMisuse(f"env {env} is in a feedback but holds no action on this connection")
        if not (len(rewards) == len(terminated) == len(truncated) == len(envs)):
            raise ProtocolMisuse("rewards, terminated and truncated must have one entry per env")
        for env, row, term, trunc in zip(envs, rows, terminated, truncated):
            self.holding.discard(env)
            if term or trunc:
                self._server_holds.pop(env, None)
            else:
                self._server_holds[env] = row
        steps = tuple(int(s) for s in step_ids)
        values = (list(rewards), list(terminated), list(truncated), dict(info))
        rows = list(rows)
        text_format = self._text_format

        def build() -> dict:
            observation = batch_rows(rows, text_format)
            return build_feedback(envs, steps, observation, *values)

        self.phase = Phase.INFER
        return Outgoing(kind="feedback", env_indices=envs, _build=build)

    def close(self) -> tuple[int, ...]:
        """The connection is gone: the envs whose chunk (and held feedback) is lost."""
        lost = tuple(sorted(self.holding | set(self._inflight)))
        self.holding.clear()
        self._inflight = ()
        self._server_holds.clear()
        self.phase = Phase.CLOSED
        return lost

    # -- helpers ---------------------------------------------------------

    def _expect(self, phase: Phase, what: str) -> None:
        if self.phase is not phase:
            raise ProtocolMisuse(f"cannot send {what} now: the connection expects {self.phase.value!r}")

    @staticmethod
    def _check_envs(
        env_indices: Sequence[int], step_ids: Sequence[int], rows: Sequence[Any], what: str
    ) -> tuple[int, ...]:
        envs = tuple(int(e) for e in env_indices)
        if len(set(envs)) != len(envs):
            raise ProtocolMisuse(f"{what}: env indices {list(envs)} are not unique")
        if any(e < 0 for e in envs):
            raise ProtocolMisuse(f"{what}: env indices must be non-negative")
        if not (len(step_ids) == len(rows) == len(envs)):
            raise ProtocolMisuse(f"{what}: env_indices, step_ids and rows must have the same length")
        if any(int(s) < 0 for s in step_ids):
            raise ProtocolMisuse(f"{what}: step ids must be non-negative")
        return envs


__all__ = ["SAME_AS_FEEDBACK", "Connection", "ObservationRow", "Outgoing", "Phase"]
