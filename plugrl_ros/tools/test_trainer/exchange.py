"""One connection's exchange as the test trainer judges it, without I/O: a client frame in, what to send out.

The protocol's rules are :class:`TrainerConnection`'s (lenient: it reports
every broken rule and stops only where the stream cannot go on); this module
files what it finds under the report's clauses and adds the checks a
conformance checker makes beyond a server's: the conventions a server
tolerates (an array's exact dtype), and the probe clauses. Stream-level
violations (a frame that does not decode, a wrong envelope, a message out of
order) end the connection with a resync, as a PlugRL server would; everything
else is recorded and the exchange goes on, so one run reports as many
distinct problems as possible.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from plugrl_ros.protocol.codec import packb
from plugrl_ros.protocol.messages import FEEDBACK, INFER
from plugrl_ros.protocol.server_messages import Feedback, Infer, Problem, Resync, Rule
from plugrl_ros.protocol.trainer_connection import ServerPhase, TrainerConnection
from plugrl_ros.tools.test_trainer.clauses import (
    ALTERNATION,
    ARRAYS,
    BINARY_FRAMES,
    ENV_SETS,
    ENVELOPE,
    INFO_EPISODE,
    LARGE_METADATA,
    OBSERVATION,
    RECONNECTS,
    REUSE,
)
from plugrl_ros.tools.test_trainer.probe_checks import ProbeChecks, probe_states
from plugrl_ros.tools.test_trainer.report import Exchanged, Recorder
from plugrl_ros.tools.test_trainer.settings import TrainerSettings, action_chunk

NORMAL_CLOSURE = 1000

# Where each rule's problems go in the report.
_CLAUSE_OF = {
    Rule.ENVELOPE: ENVELOPE,
    Rule.ARRAYS: ARRAYS,
    Rule.OBSERVATION: OBSERVATION,
    Rule.ALTERNATION: ALTERNATION,
    Rule.ENV_SETS: ENV_SETS,
    Rule.REUSE: REUSE,
    Rule.INFO: INFO_EPISODE,
}


@dataclass(frozen=True)
class Reply:
    """What the exchange wants sent: an action frame, an abort (resync) with its reason, or nothing."""

    frame: bytes | None = None
    abort: str | None = None


def close_text(code: int | None, reason: str) -> str:
    """A close as the report shows it."""
    if code is None:
        return "no close frame"
    return f"code {code}" + (f", reason {reason!r}" if reason else "")


class Exchange:
    """The checks of one connection's exchange."""

    def __init__(
        self,
        number: int,
        settings: TrainerSettings,
        rec: Recorder,
        metadata: dict,
        after_server_close: bool,
        large_metadata: bool,
    ) -> None:
        self.number = number
        self._s = settings
        self._rec = rec
        self._after_server_close = after_server_close
        self._large_metadata = large_metadata
        self._conn = TrainerConnection(strict=False, n_envs=settings.n_envs)
        self._conn.send_metadata(metadata)
        self._probe = ProbeChecks(number, rec) if settings.probe else None
        self.messages = 0

    @property
    def feedbacks(self) -> int:
        return self._conn.feedbacks

    @property
    def expecting(self) -> str:
        """The message type the exchange expects next: infer or feedback."""
        return FEEDBACK if self._conn.phase is ServerPhase.AWAIT_FEEDBACK else INFER

    def client_closed(self, code: int | None, reason: str) -> None:
        """The client ended the connection; a client that never spoke may have choked on the metadata.

        A normal close (1000) is a client stopping on purpose, which may happen
        at any moment, so it is noted rather than judged.
        """
        if self.messages > 0 or not self._large_metadata:
            return
        if code == NORMAL_CLOSURE:
            self._rec.note(
                f"connection {self.number}: the client stopped (1000) right after the metadata; "
                f"{LARGE_METADATA} was not judged on it",
                key="stopped-after-metadata",
            )
        else:
            self._rec.fail(
                LARGE_METADATA,
                f"connection {self.number}: the client closed ({close_text(code, reason)}) before sending "
                f"anything after the metadata frame of more than 1 MiB (a frame size limit?)",
            )

    def receive(self, frame: bytes | str) -> Reply:
        self.messages += 1
        where = f"connection {self.number} message {self.messages}"
        if self.messages == 1 and self._large_metadata:
            self._rec.ok(LARGE_METADATA)
        if isinstance(frame, str):
            self._rec.fail(BINARY_FRAMES, f"{where} is a text frame: {frame[:60]!r}")
            return Reply(abort="a text frame")
        self._rec.ok(BINARY_FRAMES)
        try:
            message = self._conn.receive(frame)
        except Resync as resync:
            return self._resync(resync, where)
        self._in_order(INFER if isinstance(message, Infer) else FEEDBACK, where)
        if isinstance(message, Infer):
            return self._infer(message)
        self._feedback(message)
        return Reply()

    def _in_order(self, kind: str, where: str) -> bool:
        """The checks a message passed before its own: envelope, a reconnect's first message, alternation."""
        self._rec.ok(ENVELOPE)
        if self.messages == 1 and self._after_server_close:
            # The trainer forgot every env's state with the old connection, so a
            # feedback now describes a transition it can no longer complete.
            if kind == FEEDBACK:
                self._rec.fail(
                    RECONNECTS,
                    f"feedback after reconnect: connection {self.number} began with a feedback, "
                    "for an action that arrived on an earlier connection",
                )
                return False
            self._rec.ok(RECONNECTS)
        return True

    def _resync(self, resync: Resync, where: str) -> Reply:
        problem = resync.problem
        if resync.kind is None:  # the frame is not an infer or a feedback at all
            if problem.detail.startswith("does not decode"):
                self._rec.fail(_CLAUSE_OF[problem.rule], f"{where} {problem.detail}")
                return Reply(abort="an undecodable frame")
            self._rec.fail(ENVELOPE, f"{where}: {problem.detail}")
            return Reply(abort="a malformed message")
        if problem.rule is Rule.ENVELOPE:
            self._rec.fail(ENVELOPE, f"{where}: {problem.detail}")
            return Reply(abort="a malformed message")
        if not self._in_order(resync.kind, where):
            return Reply(abort="a feedback first after a reconnect")
        if problem.rule is Rule.ALTERNATION:
            if self.messages == 1:
                detail = f"connection {self.number} {problem.detail.removeprefix('the connection ')}"
            else:
                detail = f"{where}: {problem.detail}"
            self._rec.fail(ALTERNATION, detail)
            return Reply(abort="a message out of order")
        self._rec.ok(ALTERNATION)
        count = self._conn.infers if resync.kind == INFER else self._conn.feedbacks
        self._rec.fail(_CLAUSE_OF[problem.rule], f"{resync.kind} {count} on connection {self.number}: {problem}")
        field = "reuse flags" if "reuse" in problem.detail.split(" ", 1)[0] else "env_indices"
        return Reply(abort=f"unusable {field}")

    def _problems(self, message: Infer | Feedback, rule: Rule) -> list[str]:
        """The message's problems under ``rule`` (notes go to the report's notes)."""
        found: Iterable[Problem] = message.violations + message.deviations
        problems = []
        for problem in found:
            if problem.rule is not rule:
                continue
            if problem.note:
                self._rec.note(problem.detail, problem.detail.split(";")[0])
            else:
                problems.append(problem.detail)
        return problems

    def _infer(self, infer: Infer) -> Reply:
        self._rec.ok(ALTERNATION)
        number = self._conn.infers
        where = f"infer {number} on connection {self.number}"
        self._rec.check(ARRAYS, where, self._problems(infer, Rule.ARRAYS))
        obs_problems = self._problems(infer, Rule.OBSERVATION)
        rows_match = infer.observation.rows == len(infer.env_indices) - sum(infer.reuse or ())
        states = None
        if self._probe is not None:
            states = probe_states(infer.observation.data, infer.observation.rows, self._s.action_dim)
            if states is None:
                obs_problems.append(
                    f"the probe environment needs states t <f8 [n, 1] and a <f8 [n, {self._s.action_dim}]"
                )
        self._rec.check(OBSERVATION, where, obs_problems)
        reuse_problems = self._problems(infer, Rule.REUSE)
        if infer.reuse is not None or not self._conn.reuse_offered:
            self._rec.check(REUSE, where, reuse_problems)
        self._rec.check(ENV_SETS, where, self._problems(infer, Rule.ENV_SETS))
        s = self._s
        action = action_chunk(infer.env_indices, s.horizon, s.action_dim, s.action_dtype)
        if self._probe is not None:
            t_data = states[0] if states is not None and rows_match else None
            self._probe.infer(number, infer, action.astype(np.float64), t_data)
        self._rec.exchanged(
            Exchanged(
                self.number, INFER, infer.env_indices, infer.step_ids, infer.reuse, infer.observation.data, action
            )
        )
        return Reply(frame=packb(self._conn.answer(action)))

    def _feedback(self, feedback: Feedback) -> None:
        self._rec.ok(ALTERNATION)
        where = f"feedback {self._conn.feedbacks} on connection {self.number}"
        self._rec.exchanged(
            Exchanged(
                self.number,
                FEEDBACK,
                feedback.env_indices,
                feedback.step_ids,
                None,
                feedback.observation.data,
                rewards=feedback.rewards,
                terminated=feedback.terminated,
                truncated=feedback.truncated,
            )
        )
        self._rec.check(ARRAYS, where, self._problems(feedback, Rule.ARRAYS))
        obs_problems = self._problems(feedback, Rule.OBSERVATION)
        states = None
        if self._probe is not None:
            states = probe_states(feedback.observation.data, feedback.observation.rows, self._s.action_dim)
            if states is None:
                obs_problems.append(
                    f"the probe environment needs states t <f8 [n, 1] and a <f8 [n, {self._s.action_dim}]"
                )
        self._rec.check(OBSERVATION, where, obs_problems)
        self._rec.check(ENV_SETS, where, self._problems(feedback, Rule.ENV_SETS))
        info_problems = self._problems(feedback, Rule.INFO)
        if self._probe is None:
            # the probe's info-episode check covers this; without the probe, only a failure is worth a line
            for detail in info_problems:
                self._rec.fail(INFO_EPISODE, f"{where}: {detail}")
            return
        if states is not None and feedback.observation.rows != len(feedback.env_indices):
            states = None
        self._probe.feedback(where, feedback, states)
