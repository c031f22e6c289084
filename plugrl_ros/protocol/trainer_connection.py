"""The rules of one PlugRL connection from the trainer's side, as a sans-I/O state machine.

The server-side twin of :class:`plugrl_ros.protocol.connection.Connection`:
no sockets and no event loop. :meth:`TrainerConnection.receive` takes a
client frame and returns the checked :class:`Infer` or :class:`Feedback`;
:meth:`TrainerConnection.answer` builds the action for the pending infer.
The per-connection rules live here: metadata first, strict alternation of
infer and feedback, an env in a feedback only while it holds an action and
in an infer only while it holds none, a reuse only when offered and only
after a non-terminal feedback on this connection, and an ``info`` that
splits per env. Every trainer in this package (the demo's, the test
trainer, the benchmarks' and the tests' fixture) is built on it, so they
agree on what a client may do.

A strict connection raises :class:`Resync` on the first broken rule, as
PlugRL's server does; a lenient one (a conformance checker's) raises only
when the stream cannot go on and otherwise returns the message with its
violations, so one run reports as many distinct problems as it can.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from plugrl_ros.protocol.messages import FEEDBACK, INFER, REUSE_FEEDBACK_OBS
from plugrl_ros.protocol.server_messages import (
    Feedback,
    Infer,
    Message,
    Problem,
    Resync,
    Rule,
    build_action,
    build_metadata,
    check_envelope,
    decode,
    parse_feedback,
    parse_infer,
)


class ServerPhase(enum.Enum):
    """What the trainer's side of the connection expects next."""

    SEND_METADATA = "send metadata"  # the trainer speaks first
    AWAIT_INFER = "infer"  # the client's turn: an infer
    ANSWER = "answer"  # the trainer's turn: the action for that infer
    AWAIT_FEEDBACK = "feedback"  # the client's turn: a feedback
    CLOSED = "closed"


class TrainerConnection:
    """One connection's protocol state, from the trainer's side."""

    def __init__(self, *, strict: bool = True, n_envs: int | None = None, check_observations: bool = True) -> None:
        self.phase = ServerPhase.SEND_METADATA
        self.strict = strict
        # a benchmark's trainer must stay cheap: it may skip the observations' layout (and their row counts)
        self.check_observations = check_observations
        self.n_envs = n_envs  # if set, env indices must be below it
        self.features: frozenset[str] = frozenset()
        self.infers = 0
        self.feedbacks = 0
        self._pending: tuple[int, ...] = ()  # the infer awaiting its action
        # env -> the number of the infer whose action it holds (until its feedback)
        self.holding: dict[int, int] = {}
        # env -> whether its last feedback on this connection ended the episode (None: the flags were unreadable)
        self._last_ended: dict[int, bool | None] = {}

    # -- the trainer speaks ------------------------------------------------------

    def send_metadata(self, data: Mapping[str, Any]) -> dict:
        """The metadata message; its ``features`` are what the client may use on this connection."""
        self._expect(ServerPhase.SEND_METADATA, "send the metadata")
        features = data.get("features", ())
        self.features = (
            frozenset(f for f in features if isinstance(f, str)) if isinstance(features, list) else frozenset()
        )
        self.phase = ServerPhase.AWAIT_INFER
        return build_metadata(data)

    def answer(self, action: np.ndarray) -> dict:
        """The action message for the pending infer: ``action`` is ``[H, n, *da]`` in its env order."""
        return build_action(self.answered(), action)

    def answered(self) -> tuple[int, ...]:
        """Mark the pending infer answered (by a frame built elsewhere); its env indices."""
        self._expect(ServerPhase.ANSWER, "answer")
        envs, self._pending = self._pending, ()
        self.phase = ServerPhase.AWAIT_FEEDBACK
        return envs

    def close(self) -> None:
        """The connection is gone, and with it everything known about its envs."""
        self.holding.clear()
        self._last_ended.clear()
        self._pending = ()
        self.phase = ServerPhase.CLOSED

    @property
    def reuse_offered(self) -> bool:
        return REUSE_FEEDBACK_OBS in self.features

    def may_reuse(self, env: int) -> bool:
        """Whether a reused row of ``env`` is legal: its last feedback here was not terminal."""
        return env in self._last_ended and self._last_ended[env] is not True

    # -- the client speaks ---------------------------------------------------------

    def receive(self, frame: bytes | str) -> Message:
        """Check a client frame against every rule; :class:`Resync` when the stream cannot go on."""
        try:
            return self._receive(frame)
        except Resync:
            self.close()
            raise

    def _receive(self, frame: bytes | str) -> Message:
        expected = FEEDBACK if self.phase is ServerPhase.AWAIT_FEEDBACK else INFER
        message = decode(frame, expected)
        kind = message["message_type"]
        check_envelope(message)
        if self.phase is not ServerPhase.AWAIT_INFER and self.phase is not ServerPhase.AWAIT_FEEDBACK:
            raise Resync(Problem(Rule.ALTERNATION, f"a {kind} while the trainer's turn was {self.phase.value!r}"), kind)
        if kind != expected:
            if self.infers == 0 and self.feedbacks == 0:
                detail = f"the connection began with a {kind}; the first message on a connection is an infer"
            elif kind == INFER:
                detail = f"a second infer before the feedback of infer {self.infers}"
            else:
                detail = f"a feedback with no infer since feedback {self.feedbacks}"
            raise Resync(Problem(Rule.ALTERNATION, detail), kind)
        received = self._infer(message) if kind == INFER else self._feedback(message)
        if self.strict and received.violations:
            raise Resync(received.violations[0], kind)
        return received

    def _infer(self, message: dict) -> Infer:
        self.infers += 1
        infer = parse_infer(message, self.check_observations)
        problems: list[Problem] = []
        if infer.reuse is not None:
            if not self.reuse_offered:
                problems.append(
                    Problem(Rule.REUSE, f"sent a reuse key, but the metadata did not offer {REUSE_FEEDBACK_OBS}")
                )
            for env, reused in zip(infer.env_indices, infer.reuse):
                if not reused or self.may_reuse(env):
                    continue
                if env not in self._last_ended:
                    detail = f"env {env} is marked reuse but has no feedback on this connection"
                else:
                    detail = (
                        f"env {env} is marked reuse after a terminal feedback (terminated or truncated): "
                        "its next observation is the reset one"
                    )
                problems.append(Problem(Rule.REUSE, detail))
        problems += self._index_problems(infer.env_indices, "an infer")
        for env in infer.env_indices:
            if env in self.holding:
                problems.append(
                    Problem(Rule.ENV_SETS, f"env {env} still holds the action of infer {self.holding[env]}")
                )
        for env in infer.env_indices:
            self.holding[env] = self.infers
        self._pending = infer.env_indices
        self.phase = ServerPhase.ANSWER
        return _with(infer, problems)

    def _feedback(self, message: dict) -> Feedback:
        self.feedbacks += 1
        feedback = parse_feedback(message, self.check_observations)
        problems = self._index_problems(feedback.env_indices, "a feedback")
        for env in feedback.env_indices:
            if env not in self.holding:
                problems.append(Problem(Rule.ENV_SETS, f"env {env} holds no action (no infer since its last feedback)"))
        ended = feedback.ended
        seen: set[int] = set()
        for row, env in enumerate(feedback.env_indices):
            self.holding.pop(env, None)
            if env not in seen:
                seen.add(env)
                self._last_ended[env] = None if ended is None else bool(ended[row])
        self.phase = ServerPhase.AWAIT_INFER
        return _with(feedback, problems)

    def _index_problems(self, envs: tuple[int, ...], what: str) -> list[Problem]:
        problems = []
        if not envs:
            problems.append(Problem(Rule.ENV_SETS, f"{what} must carry at least one env"))
        if len(set(envs)) != len(envs):
            problems.append(Problem(Rule.ENV_SETS, f"env_indices {list(envs)[:16]} repeat an env"))
        negative = [e for e in envs if e < 0]
        if negative:
            problems.append(Problem(Rule.ENV_SETS, f"env indices {negative[:8]} are negative"))
        if self.n_envs is not None:
            beyond = [e for e in envs if e >= self.n_envs]
            if beyond:
                problems.append(Problem(Rule.ENV_SETS, f"env indices {beyond[:8]} are not below n_envs {self.n_envs}"))
        return problems

    def _expect(self, phase: ServerPhase, what: str) -> None:
        assert self.phase is phase, f"cannot {what} now: the connection expects {self.phase.value!r}"


def _with(message: Any, problems: Iterable[Problem]) -> Any:
    """``message`` with the connection's problems before its own (the connection's rules come first)."""
    extra = tuple(problems)
    if not extra:
        return message
    return dataclasses.replace(message, violations=extra + message.violations)


__all__ = ["Feedback", "Infer", "Problem", "Resync", "Rule", "ServerPhase", "TrainerConnection"]
