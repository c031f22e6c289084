"""The link's figures for RLlib's metrics: robots connected, infer round trip, robots' idle share, inference cost.

A robot is an env index on an open bridge connection, from its first infer
until the connection closes. It is idle while its infer waits for an answer:
from the moment the frame was read to the moment the action went out, which
with on-policy timing includes the whole learner update. The idle share of a
window (one training iteration, between two ``get_metrics`` calls) is the
robots' waiting time over their connected time in it; the paused share is the
part of it while the runner answered nobody (between two ``sample()`` calls
with on-policy timing: the learner's update). Inference cost is the
sampling thread's time for the connectors and the RLModule, per robot row.
Written by the websocket and sampling threads, read by the sampling thread.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Figures:
    """One window's figures."""

    bridges: int  # open connections now
    robots: int  # envs on them now
    infers: int  # infers answered in the window
    round_trip_ms: float | None  # median, frame read to action sent (the robot's wait, minus the network)
    idle_share: float | None  # waiting time / connected time of the robots, over the window
    paused_share: float | None  # the part of it spent while the runner answered nobody (the learner's update)
    inference_ms_per_row: float | None  # connectors + RLModule, per env row answered


class LinkFigures:
    """Counts the link's figures (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._links: dict[int, set[int]] = {}  # open connection -> its robots (env indices) seen so far
        self._waiting: dict[tuple[int, int], float] = {}  # (link, env) -> when its infer was read
        self._window_start = clock()
        self._last = self._window_start
        self._robot_time = 0.0
        self._idle = 0.0
        self._paused_idle = 0.0
        self._paused_at: float | None = None  # the runner answers nobody since then
        self._round_trips: list[float] = []
        self._rows = 0
        self._inference_s = 0.0
        self.first_opened_at: float | None = None  # when the first bridge connected (clock time)
        self.answers_sent = 0  # since the start

    @property
    def bridges(self) -> int:
        """Connections open now."""
        with self._lock:
            return len(self._links)

    def _advance(self, now: float) -> None:
        self._robot_time += sum(len(envs) for envs in self._links.values()) * max(0.0, now - self._last)
        self._last = now

    def opened(self, link: int) -> None:
        with self._lock:
            now = self._clock()
            self._advance(now)
            self._links[link] = set()
            if self.first_opened_at is None:
                self.first_opened_at = now

    def closed(self, link: int) -> None:
        with self._lock:
            now = self._clock()
            self._advance(now)
            for env in self._links.pop(link, ()):
                since = self._waiting.pop((link, env), None)
                if since is not None:
                    self._idle += now - max(since, self._window_start)

    def infer_read(self, link: int, envs: Iterable[int], at: float) -> None:
        with self._lock:
            self._advance(self._clock())
            robots = self._links.get(link)
            if robots is None:
                return
            for env in envs:
                robots.add(env)
                self._waiting[link, env] = at

    def answer_sent(self, link: int, envs: Iterable[int], read_at: float) -> None:
        with self._lock:
            now = self._clock()
            self._advance(now)
            self._round_trips.append(now - read_at)
            self.answers_sent += 1
            for env in envs:
                since = self._waiting.pop((link, env), None)
                if since is not None:
                    self._idle += now - max(since, self._window_start)

    def pause(self) -> None:
        """The runner stops answering (on-policy timing: sample() returned and the learner updates)."""
        with self._lock:
            self._paused_at = self._clock()

    def resume(self) -> None:
        """The runner answers again: whoever waited meanwhile waited for the update."""
        with self._lock:
            now = self._clock()
            if self._paused_at is not None:
                start = max(self._paused_at, self._window_start)
                self._paused_idle += sum(now - max(since, start) for since in self._waiting.values())
            self._paused_at = None

    def inference(self, rows: int, seconds: float) -> None:
        with self._lock:
            self._rows += rows
            self._inference_s += seconds

    def take(self) -> Figures:
        """This window's figures; the next window starts now."""
        with self._lock:
            now = self._clock()
            self._advance(now)
            waiting = sum(now - max(since, self._window_start) for since in self._waiting.values())
            idle = self._idle + waiting
            paused_idle = self._paused_idle
            if self._paused_at is not None:
                start = max(self._paused_at, self._window_start)
                paused_idle += sum(now - max(since, start) for since in self._waiting.values())
            figures = Figures(
                bridges=len(self._links),
                robots=sum(len(envs) for envs in self._links.values()),
                infers=len(self._round_trips),
                round_trip_ms=1e3 * statistics.median(self._round_trips) if self._round_trips else None,
                idle_share=min(1.0, idle / self._robot_time) if self._robot_time > 0 else None,
                paused_share=min(1.0, paused_idle / self._robot_time) if self._robot_time > 0 else None,
                inference_ms_per_row=1e3 * self._inference_s / self._rows if self._rows else None,
            )
            self._window_start = now
            self._robot_time = self._idle = self._paused_idle = self._inference_s = 0.0
            if self._paused_at is not None:
                self._paused_at = now
            self._round_trips = []
            self._rows = 0
            return figures
