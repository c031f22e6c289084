"""One robot's deploy stepping: when to request a chunk, and which action each control tick applies.

The node calls, per control tick: :meth:`PolicyRunner.step` (the action for
this tick, or None: idle, so the sink's idle behaviour applies), then
:meth:`PolicyRunner.wants_request` (capture an observation now and send it,
tagged with :meth:`PolicyRunner.requested`). Answers come back through
:meth:`PolicyRunner.on_chunk`. Ticks are counted, not timed: row ``k`` of a
chunk whose observation was captured at tick ``t`` is meant for tick
``t + k`` (openpi's convention: the first action is for the moment of the
observation). The injected clock only measures latencies and the step rate.

Safety rules: a chunk never replays a step whose tick has passed, a chunk
with no step left is dropped and counted, and when nothing valid is left
the answer is None, never an extrapolation. When the link drops, every chunk
is dropped: the robot idles at the next tick rather than finish a plan
nobody is watching over.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from plugrl_ros.policy.execution import ExecutionSettings, crossfade, ensemble
from plugrl_ros.policy.stats import LatencyWindow, PolicyStats, RateWindow


@dataclass(frozen=True)
class LiveChunk:
    """A chunk whose row ``k`` is meant for tick ``tick + k``."""

    number: int  # the request it answers
    tick: int
    actions: np.ndarray  # [H, D]

    @property
    def last_tick(self) -> int:
        return self.tick + self.actions.shape[0] - 1

    def covers(self, tick: int) -> bool:
        return self.tick <= tick <= self.last_tick

    def row(self, tick: int) -> np.ndarray:
        return self.actions[tick - self.tick]


@dataclass(frozen=True)
class _Pending:
    number: int
    tick: int  # the tick the observation was captured at
    sent_at: float


@dataclass(frozen=True)
class _Fade:
    old: LiveChunk
    start: int  # the first tick of the new chunk


class PolicyRunner:
    """Request-ahead, latency alignment and takeover for one robot; see the module docstring."""

    def __init__(self, settings: ExecutionSettings, period_s: float, clock: Callable[[], float]) -> None:
        assert period_s > 0
        self.settings = settings
        self.period_s = period_s
        self._clock = clock
        self.tick = -1  # the last tick stepped
        self.connected = False
        self._chunks: list[LiveChunk] = []  # oldest first
        self._pending: _Pending | None = None
        self._fade: _Fade | None = None
        self._numbers = 0
        self._discard: int | None = None  # an outstanding request whose answer must not run (see hold)
        self.row: int | None = None  # the newest live chunk's row this tick's action comes from (None: idle)
        self.outcome = ""  # what became of the last answer (on_chunk's result)
        self.first_row: int | None = None  # the row the last applied chunk starts from (its alignment)
        self._ran = False  # a chunk has run on this connection: idling now is at a boundary
        self._answered = False  # an answer came on this connection: later ones have the steady bound
        self._latency = LatencyWindow(settings.latency_window)
        self._rate = RateWindow()
        self._counts = dict.fromkeys(
            ("requests", "chunks", "stale_dropped", "rejected", "abandoned", "idle_steps", "waiting_steps", "steps"), 0
        )

    # -- per tick ------------------------------------------------------------------

    def step(self) -> np.ndarray | None:
        """Advance one tick; the action for it, or None (idle: nothing valid is left)."""
        self.tick += 1
        t = self.tick
        self._chunks = [c for c in self._chunks if c.last_tick >= t]
        action = self._action(t)
        self.row = None if action is None else t - self._chunks[-1].tick
        if action is None:
            self._counts["idle_steps" if self._ran else "waiting_steps"] += 1
        else:
            self._ran = True
            self._counts["steps"] += 1
            self._rate.add(self._clock())
        return action

    def _action(self, t: int) -> np.ndarray | None:
        live = [c for c in self._chunks if c.covers(t)]
        if not live:
            return None
        mode = self.settings.mode
        if mode == "ensemble":
            return ensemble([c.row(t) for c in live], self.settings.ensemble_rate)
        newest = live[-1]
        fade = self._fade
        if (
            mode == "crossfade"
            and fade is not None
            and fade.old.covers(t)
            and t - fade.start < self.settings.crossfade_steps
        ):
            return crossfade(fade.old.row(t), newest.row(t), t - fade.start, self.settings.crossfade_steps)
        return newest.row(t).copy()

    def steps_left(self) -> int:
        """Steps of the newest chunk after the current tick (-1 with no chunk)."""
        if not self._chunks:
            return -1
        return self._chunks[-1].last_tick - self.tick

    def request_ahead(self) -> int:
        """The threshold of steps left at which the next request goes out."""
        fixed = self.settings.request_ahead_steps
        if fixed is not None:
            return fixed
        latency = self._latency.percentile(95)
        if latency is None:
            latency = self.settings.initial_latency_s
        # ticks until the answer can be applied, plus one for the timer's jitter
        return math.ceil(latency / self.period_s - 1e-9) + 1

    def wants_request(self) -> bool:
        """Whether to capture an observation now (after this tick's step) and send it."""
        if not self.connected or self._pending is not None:
            return False
        left = self.steps_left()
        if self.settings.mode == "sync":
            return left <= 0
        return left <= self.request_ahead()

    def requested(self) -> int:
        """Record a request sent now, for the observation of the current tick; its number (the tag)."""
        assert self._pending is None, "one request at a time"
        number = self._numbers
        self._numbers += 1
        self._pending = _Pending(number, self.tick, self._clock())
        self._counts["requests"] += 1
        return number

    @property
    def pending_request(self) -> int | None:
        """The number of the request awaiting its answer, if any."""
        return None if self._pending is None else self._pending.number

    def planned(self) -> bool:
        """Whether anything is planned: a chunk with steps left, or a request awaiting its answer."""
        return self._pending is not None or any(c.last_tick > self.tick for c in self._chunks)

    def answer_bound(self) -> tuple[float, str]:
        """How long the outstanding request may go unanswered, and the setting that says so.

        A connection's first answer may be slow for good reasons (a model
        compiling): ``first_answer_s``; every later one ``max_latency_s``.
        """
        if self._answered:
            return self.settings.max_latency_s, "latency.max_s"
        return self.settings.first_answer_s, "latency.first_answer_s"

    def request_overdue(self) -> bool:
        """The outstanding request has gone unanswered longer than :meth:`answer_bound`: abort the link."""
        pending = self._pending
        return pending is not None and self._clock() - pending.sent_at > self.answer_bound()[0]

    # -- answers and the link ------------------------------------------------------

    def on_chunk(self, number: int, actions: np.ndarray) -> str:
        """Take the answer to request ``number``: "applied", or why it was dropped.

        "stale" (it came after its last step), "dropped" (asked for before a
        :meth:`hold`), "unknown" (a request the link lost or we abandoned).
        The outcome stays in :attr:`outcome` (and an applied chunk's alignment in :attr:`first_row`).
        """
        self.outcome = self._take(number, actions)
        return self.outcome

    def _take(self, number: int, actions: np.ndarray) -> str:
        pending = self._pending
        if pending is None or pending.number != number:
            return "unknown"  # a request the link lost or we abandoned
        self._pending = None
        self._answered = True
        self._latency.add(self._clock() - pending.sent_at)
        assert actions.ndim == 2 and actions.shape[0] >= 1
        if self._discard == number:
            self._discard = None
            return "dropped"
        if self.settings.mode == "sync":
            # run whole, from row 0 at the next tick
            self._chunks = [LiveChunk(number, self.tick + 1, actions)]
            self._counts["chunks"] += 1
            self.first_row = 0
            return "applied"
        chunk = LiveChunk(number, pending.tick, actions)
        if chunk.last_tick <= self.tick:
            self._counts["stale_dropped"] += 1
            return "stale"
        self._counts["chunks"] += 1
        self.first_row = self.tick + 1 - chunk.tick  # rows before it were meant for ticks that passed
        running = [c for c in self._chunks if c.last_tick > self.tick]
        if self.settings.mode == "ensemble":
            self._chunks = [*running, chunk]
        elif self.settings.mode == "crossfade" and running:
            self._fade = _Fade(running[-1], self.tick + 1)
            self._chunks = [running[-1], chunk]
        else:
            self._fade = None
            self._chunks = [chunk]
        return "applied"

    def on_rejected(self, number: int) -> None:
        """The answer to request ``number`` broke the contract: nothing of it runs; the next request may go."""
        if self._pending is not None and self._pending.number == number:
            self._pending = None
            self._answered = True  # the link carried an answer, if a wrong one
            self._counts["rejected"] += 1

    def abandon(self) -> None:
        """Give up on the outstanding request (after :meth:`request_overdue`); a late answer is then ignored."""
        if self._pending is not None:
            self._pending = None
            self._discard = None
            self._counts["abandoned"] += 1

    def hold(self) -> None:
        """The robot stops stepping for a while (pause, dead-man, reset): drop every chunk now.

        Ticks are counted, not timed, so a chunk kept across a pause would
        replay steps whose moment passed during it. The outstanding request,
        if any, stays outstanding (the connection allows no other) but its
        answer is dropped when it comes: its observation predates the pause.
        """
        self._chunks = []
        self._fade = None
        self._ran = False
        if self._pending is not None:
            self._discard = self._pending.number

    def on_connected(self) -> None:
        self.connected = True
        self._answered = False

    def on_link_lost(self) -> None:
        """The connection ended: forget its request and drop every chunk (idle from the next tick)."""
        self.connected = False
        self._pending = None
        self._discard = None
        self._chunks = []
        self._fade = None
        self._ran = False

    def stats(self) -> PolicyStats:
        return PolicyStats(
            **self._counts,
            latency_median_s=self._latency.percentile(50),
            latency_p95_s=self._latency.percentile(95),
            step_rate_hz=self._rate.rate(),
        )
