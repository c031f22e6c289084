"""The rollout core: n envs sharing one trainer connection, with no ROS, network or wall clock.

A driver (the ROS bridge node, or the headless probe) feeds it the trainer's
frames and the envs' step results, asks it which action each env applies
next, and calls :meth:`Rollout.poll` to get the messages to send. The core
owns the connection's rules (through
:class:`plugrl_ros.protocol.connection.Connection`) and each env's chunk and
episode (:class:`EnvRollout`); the scheduling rule is
:func:`plugrl_ros.rollout.scheduler.decide_feedback`. Time comes from an
injected clock, so all of it is deterministic under test.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from plugrl_ros.protocol.connection import SAME_AS_FEEDBACK, Connection, Outgoing, Phase
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.messages import ActionChunk, Metadata, ObservationRow, TextFormat, action_width, episode_info
from plugrl_ros.rollout.env_rollout import EnvRollout, StepsExecuted
from plugrl_ros.rollout.scheduler import Decision, Timing, decide_feedback

Capture = Callable[[int], "ObservationRow | None"]


class ActionSpaceMismatch(ProtocolError):
    """The trainer's action (its announced or sent width or horizon) does not fit the configured actions.

    A broken rule of the link, but not a passing one: every reconnect to the same trainer meets it
    again, so the driver treats it as a configuration problem (said once, retried slowly).
    """


@dataclass(frozen=True)
class RolloutSettings:
    """What the core needs to know about the envs and the trainer."""

    n_envs: int
    min_action_width: int = 1  # the sinks read action values [0, min_action_width)
    # the sinks read exactly min_action_width values: an announced wider action is refused (unless it is
    # action_width); off for a driver that applies whatever width comes (the headless probe)
    refuse_wider: bool = False
    action_horizon: int | None = None  # expected H when the trainer does not announce it
    action_width: int | None = None  # expected width when the trainer does not announce it
    replan_steps: int = 0  # run at most this many steps of each chunk; 0 = all
    max_episode_steps: int = 0  # 0 = no time limit
    feedback_deadline_s: float = 30.0
    batch_window_s: float = 0.02
    use_reuse: bool = True
    text_format: TextFormat = "array"
    # each connection starts every env on a fresh episode (at startup, and after every close)
    fresh_episodes: bool = False
    resets: bool = True  # a reset procedure is configured; without one the first observation starts an episode
    # a person may command steps: every feedback's info says, per step, what ran and whether it was the chunk's
    interventions: bool = False


@dataclass(frozen=True)
class FrameResult:
    """What a trainer frame meant for the driver."""

    # mismatch: the trainer's action space does not fit the configuration (close; reconnect slowly)
    kind: Literal["metadata", "action", "error", "mismatch", "ignored"]
    envs: tuple[int, ...] = ()
    detail: str = ""
    metadata: Metadata | None = None


class Rollout:
    """All envs of one bridge, their shared connection, and the scheduling between them."""

    def __init__(self, settings: RolloutSettings, clock: Callable[[], float]) -> None:
        assert settings.n_envs >= 1
        self.settings = settings
        self._clock = clock
        self.envs = [
            EnvRollout(i, settings.max_episode_steps, settings.resets, settings.interventions)
            for i in range(settings.n_envs)
        ]
        if settings.fresh_episodes and settings.resets:
            # the robot may be anywhere: in the middle of an episode a previous bridge left
            for env in self.envs:
                env.needs_reset = True
        self.connection: Connection | None = None
        self.epoch = 0
        self.metadata: Metadata | None = None
        self.paused = False
        self._broken = False  # the trainer broke the protocol; await the close
        self._infer_sent_at = 0.0
        self._action_received_at = 0.0
        self._first_pending_at: float | None = None
        # lifetime counters
        self.connections = 0
        self.actions_received = 0
        self.feedbacks_sent = 0
        self.infers_sent = 0
        self.infer_latencies: deque[float] = deque(maxlen=200)
        # set when a held chunk can neither run nor be fed back: the driver must
        # reopen the connection, the only way the protocol lets a chunk be dropped
        self.reopen_reason: str | None = None

    # -- the trainer side ------------------------------------------------

    @property
    def connected(self) -> bool:
        return self.connection is not None and not self._broken

    def on_connected(self, epoch: int) -> None:
        assert all(not e.holds_action and not e.inferring for e in self.envs)
        self.connection = Connection(use_reuse=self.settings.use_reuse, text_format=self.settings.text_format)
        self.epoch = epoch
        self.metadata = None
        self._broken = False
        self.connections += 1

    def on_frame(self, epoch: int, frame: bytes) -> FrameResult:
        """A frame from connection ``epoch``; an ``error`` result means: close it and reconnect."""
        if epoch != self.epoch or self.connection is None or self._broken:
            return FrameResult("ignored")
        try:
            received = self.connection.receive(frame)
            if isinstance(received, Metadata):
                self.metadata = received
                self._check_announced_width(received.action_dim)
                return FrameResult("metadata", metadata=received)
            self._check_shape(received)
        except ActionSpaceMismatch as exc:
            self._broken = True
            return FrameResult("mismatch", detail=str(exc))
        except ProtocolError as exc:
            self._broken = True
            return FrameResult("error", detail=str(exc))
        now = self._clock()
        self._action_received_at = now
        self.infer_latencies.append(now - self._infer_sent_at)
        self.actions_received += 1
        steps = received.horizon
        if self.settings.replan_steps > 0:
            steps = min(steps, self.settings.replan_steps)
        width = action_width(received)
        for row, env_index in enumerate(received.env_ids):
            actions = received.actions[:steps, row].reshape(steps, width)
            self.envs[env_index].start_chunk(actions, received.horizon)
            if self.paused:
                # the episode is being truncated: one step, then feedback
                self.envs[env_index].cut = self.envs[env_index].truncate = True
        return FrameResult("action", envs=received.env_ids)

    def _check_announced_width(self, width: int | None) -> None:
        """An announced action width must be the one the sinks read, or the configured ``action_width``.

        A wider one is refused like a narrower one: a trainer learning values
        that no actuator applies is almost always paired with the wrong robot
        or config, and would otherwise train on without them, silently. A user
        who means to ignore the extra values says so by configuring that width.
        """
        needed = self.settings.min_action_width
        if width is None or width == needed:
            return
        if width > needed and (not self.settings.refuse_wider or width == self.settings.action_width):
            return
        detail = f"{width}, but the configured actions read {needed} values per step"
        if width > needed:
            detail += f" (to run on the first {needed} and ignore the rest, set control.action_dim: {width})"
        raise ActionSpaceMismatch("metadata.data.action_dim", detail)

    def _check_shape(self, chunk: ActionChunk) -> None:
        horizon, width = self.expected_horizon, self.expected_width
        got = action_width(chunk)
        announced = self.metadata.action_horizon if self.metadata else None
        if horizon is not None and chunk.horizon != horizon:
            # against the trainer's own metadata a passing fault; against the configuration, a mismatch
            error = ProtocolError if announced else ActionSpaceMismatch
            raise error("action.data.action", f"horizon {chunk.horizon}, but the expected horizon is {horizon}")
        if width is not None and got != width:
            error = ProtocolError if self.metadata and self.metadata.action_dim else ActionSpaceMismatch
            raise error("action.data.action", f"width {got} per step, but the expected width is {width}")
        if got < self.settings.min_action_width:
            raise ActionSpaceMismatch(
                "action.data.action",
                f"width {got} per step, but the configured actions read {self.settings.min_action_width} values",
            )

    @property
    def expected_horizon(self) -> int | None:
        announced = self.metadata.action_horizon if self.metadata else None
        return announced or self.settings.action_horizon

    @property
    def expected_width(self) -> int | None:
        announced = self.metadata.action_dim if self.metadata else None
        return announced or self.settings.action_width

    def on_disconnected(self, epoch: int) -> tuple[int, ...]:
        """Connection ``epoch`` closed: drop every chunk and held feedback; the envs that lost one."""
        if epoch != self.epoch or self.connection is None:
            return ()
        self.connection.close()
        self.connection = None
        self._first_pending_at = None
        self.reopen_reason = None
        lost = tuple(e.index for e in self.envs if e.lose_action())
        if self.settings.fresh_episodes:
            for env in self.envs:
                env.start_fresh()
        return lost

    # -- the env side ----------------------------------------------------

    def take_step(self, env: int) -> np.ndarray | None:
        """The action ``env`` applies now (its step is then in flight), or None: idle."""
        return self.envs[env].take_step()

    def step_in_flight(self, env: int) -> bool:
        return self.envs[env].step_in_flight

    def policy_may_act(self, env: int) -> bool:
        """``env``'s chunk (held or asked for) was computed for the robot's current state: no person has
        moved the robot since its observation. Otherwise the robot idles until one that was arrives."""
        return self.envs[env].policy_may_act

    def person_moved(self, env: int) -> None:
        """A person's command went out on ``env``."""
        self.envs[env].person_moved()

    def replaced(self, env: int, action: np.ndarray, person: bool) -> None:
        """``env``'s step in flight executed ``action`` instead of its chunk's (a person's command, or an idle)."""
        self.envs[env].replaced(action, person)

    def cut(self, env: int) -> None:
        """End ``env``'s chunk after its step in flight: the policy's plan no longer fits."""
        self.envs[env].cut_chunk()

    def finish_step(
        self,
        env: int,
        reward: float,
        terminated: bool,
        truncated: bool,
        success: bool,
        row: ObservationRow,
        interrupted: bool = False,
    ) -> bool:
        """Record the result of ``env``'s step in flight; True if its chunk ended."""
        ended = self.envs[env].finish_step(reward, terminated, truncated, success, row, interrupted)
        if ended and self._first_pending_at is None:
            self._first_pending_at = self._clock()
        return ended

    def fail_env(self, env: int) -> bool:
        """``env``'s step in flight will not report: truncate its episode at its last reported step.

        False if the chunk had no reported step: it cannot be fed back, and the
        driver must reopen the connection to drop it.
        """
        handled = self.envs[env].fail()
        if handled and self.envs[env].pending is not None and self._first_pending_at is None:
            self._first_pending_at = self._clock()
        return handled

    def needs_reset(self, env: int) -> bool:
        return self.envs[env].needs_reset

    def reset_done(self, env: int) -> None:
        self.envs[env].reset_done()

    def set_paused(self, paused: bool) -> None:
        """Pause: no new chunks; running chunks end after their step in flight, episodes truncated."""
        self.paused = paused
        if paused:
            for env in self.envs:
                if env.chunk is not None:
                    env.cut = env.truncate = True

    # -- scheduling ------------------------------------------------------

    def poll(self, capture: Capture) -> list[Outgoing]:
        """The messages to send now. ``capture(env)`` returns its fresh observation, or None."""
        conn = self.connection
        if conn is None or self._broken:
            return []
        out: list[Outgoing] = []
        reusable: set[int] = set()
        ended: set[int] = set()  # envs whose episode the feedback sent now ends
        rows: dict[int, ObservationRow] = {}
        if conn.phase is Phase.FEEDBACK:
            now = self._clock()
            timing = Timing(
                now=now,
                action_received_at=self._action_received_at,
                first_pending_at=self._first_pending_at if self._first_pending_at is not None else now,
                deadline_s=self.settings.feedback_deadline_s,
                batch_window_s=self.settings.batch_window_s,
            )
            if not self.paused:
                rows = self._capture_idle(capture, include_resetting_pending=True)
            awaited = self.together and any(
                e.pending is not None and e.pending.ends_episode and e.index not in rows for e in self.envs
            )
            decision = decide_feedback(
                self.envs, bool(rows), self.paused, timing, together=self.together, resets_awaited=awaited
            )
            if decision is Decision.SEND:
                feedback, reusable, ended = self._feedback(conn)
                out.append(feedback)
            elif decision is Decision.CUT:
                for env in self.envs:
                    if env.chunk is not None:
                        env.cut = True
                unrun = [e.index for e in self.envs if e.chunk is not None and e.next_step == 0]
                if self.paused and unrun:
                    self.reopen_reason = (
                        f"paused past the feedback deadline while env(s) {unrun} hold an action that never ran "
                        "(a feedback needs at least one step)"
                    )
        if conn.phase is Phase.INFER and not self.paused:
            if not out:
                rows = self._capture_idle(capture, include_resetting_pending=False)
            for env in reusable:
                rows[env] = SAME_AS_FEEDBACK
            if self.together and any(e.chunk is None and e.index not in rows for e in self.envs):
                rows = {}  # the trainer steps every env together: ask for all of them at once
            elif self.reset_step and set(rows) - ended:
                # next-step autoreset: the trainer returns an ended episode's last observation now and the
                # next episode's first one at its next step, while the others take a step: these sit out one
                for env in ended:
                    rows.pop(env, None)
            if rows:
                out.append(self._infer(conn, rows))
        return out

    @property
    def together(self) -> bool:
        """The trainer steps every env of the connection together (its metadata's ``vector_autoreset``)."""
        return self.metadata is not None and self.metadata.vector_autoreset is not None

    @property
    def reset_step(self) -> bool:
        """The trainer spends a step of its own on each reset (Gymnasium's next-step autoreset)."""
        return self.metadata is not None and self.metadata.vector_autoreset == "next-step"

    def _capture_idle(self, capture: Capture, include_resetting_pending: bool) -> dict[int, ObservationRow]:
        rows: dict[int, ObservationRow] = {}
        for env in self.envs:
            # an env whose terminal feedback is pending and whose reset is
            # done will be idle as soon as that feedback is sent
            will_be_idle = (
                include_resetting_pending
                and env.pending is not None
                and env.pending.ends_episode
                and not env.needs_reset
            )
            if env.idle or will_be_idle:
                row = capture(env.index)
                if row is not None:
                    rows[env.index] = row
        return rows

    def _feedback(self, conn: Connection) -> tuple[Outgoing, set[int], set[int]]:
        """The feedback; the envs whose rows may be reused, and those whose episode it ends."""
        sent = [e for e in self.envs if e.pending is not None]
        results = [e.fed_back() for e in sent]
        ended = [r.episode is not None for r in results]
        info = episode_info(
            ended,
            [r.episode.ret if r.episode else 0.0 for r in results],
            [r.episode.length if r.episode else 0 for r in results],
            [r.episode.success if r.episode else False for r in results],
        )
        if self.settings.interventions:
            info["intervention"] = intervention_info([r.executed for r in results])
        outgoing = conn.feedback(
            [e.index for e in sent],
            [r.step_id for r in results],
            [r.row for r in results],
            [r.reward for r in results],
            [r.terminated for r in results],
            [r.truncated for r in results],
            info,
        )
        self.feedbacks_sent += 1
        self._first_pending_at = None
        reusable = {e.index for e, r in zip(sent, results) if not r.ends_episode}
        return outgoing, reusable, {e.index for e in sent} - reusable

    def _infer(self, conn: Connection, rows: dict[int, ObservationRow]) -> Outgoing:
        envs = sorted(rows)
        outgoing = conn.infer(envs, [self.envs[i].step_id for i in envs], [rows[i] for i in envs])
        for i in envs:
            self.envs[i].asked()
        self._infer_sent_at = self._clock()
        self.infers_sent += 1
        return outgoing


def intervention_info(rows: list[StepsExecuted | None]) -> dict[str, np.ndarray]:
    """``info["intervention"]`` of a feedback: ``active`` bool ``[m, H]`` (the step ran something else than the
    chunk's action: a person's command, or an idle while the robot waited for a chunk that fits its state) and
    ``action`` ``<f4 [m, H, width]`` (what each step executed). Steps that did not run: inactive, zeros."""
    assert all(r is not None for r in rows)
    executed = [r for r in rows if r is not None]
    m = len(executed)
    horizon = max(r.horizon for r in executed)
    width = max(r.actions.shape[1] for r in executed)
    active = np.zeros((m, horizon), dtype=np.bool_)
    actions = np.zeros((m, horizon, width), dtype="<f4")
    for row, r in enumerate(executed):
        steps, w = r.actions.shape
        active[row, :steps] = r.active
        actions[row, :steps, :w] = r.actions
    return {"active": active, "action": actions}
