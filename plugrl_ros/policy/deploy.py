"""One robot in deploy mode: the policy link's events in, and per control tick an action and what to send.

This is the whole of deploy mode's stepping as the node sees it. The node
hands every link event to :meth:`DeployRobot.on_event` (logging the note it
returns), and on every control tick calls :meth:`DeployRobot.tick` with a
function that reads the robot's sources, then publishes the action (or
applies the sinks' idle behaviour for None), sends the request, and aborts
the connection if told to.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from plugrl_ros.policy.execution import ONE_STEP_CHUNKS
from plugrl_ros.policy.runner import PolicyRunner
from plugrl_ros.protocol.backoff import Backoff
from plugrl_ros.protocol.client import ClientSettings, ConnectFailed, Notice
from plugrl_ros.protocol.policy.client import (
    AnswerRejected,
    ChunkReceived,
    Event,
    PolicyConnected,
    PolicyDisconnected,
    ServerTraceback,
)
from plugrl_ros.protocol.policy.request import RequestLayout

_TRACEBACK_CHARS = 8000


@dataclass(frozen=True)
class Request:
    epoch: int
    observation: dict[str, Any]
    tag: int


@dataclass(frozen=True)
class Tick:
    """What one control tick does: publish ``action`` (None: idle), send ``request``, abort connection ``abort``."""

    action: np.ndarray | None
    request: Request | None = None
    abort: tuple[int, str] | None = None  # (epoch, why)


@dataclass(frozen=True)
class Note:
    """Something to log: level ``info``, ``warn`` or ``error``.

    ``repeats``: the kind of a warning that can come many times a second (a
    stale chunk, a rejected answer, a failed connect); the node logs each kind
    at most every few seconds, so one kind never hides another.
    """

    level: str
    text: str
    repeats: str = ""


class DeployRobot:
    """A :class:`PolicyRunner` wired to a policy link's events and a request layout.

    A rejected answer (a wrong horizon or width, a NaN) is likely to be
    rejected again: the server is not the one this robot is configured for.
    So it is said once at ERROR, and the next request waits for ``retry``'s
    next delay (the link's reconnect backoff), not for the next tick; a valid
    answer ends the backoff.
    """

    def __init__(
        self,
        runner: PolicyRunner,
        layout: RequestLayout,
        retry: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``retry``: the delays between requests after rejected answers (default: the link's defaults)."""
        self.runner = runner
        self.layout = layout
        self.epoch: int | None = None  # the connection requests go to; None while there is none
        defaults = ClientSettings()
        self._retry = retry or Backoff(defaults.reconnect_initial_s, defaults.reconnect_max_s)
        self._clock = clock
        self._retry_at = -math.inf  # no request before this time (after a rejected answer)
        self.problem = ""  # why the server's answers are rejected, while they are (empty: they are not)

    def on_event(self, event: Event) -> Note | None:
        """Apply one link event; a note to log, if any."""
        if isinstance(event, PolicyConnected):
            self.epoch = event.epoch
            self.runner.on_connected()
            shape = f"H={event.metadata.horizon}" if event.metadata.horizon else "H not announced"
            if event.metadata.horizon == 1 and self.runner.settings.mode != "sync":
                where = f"connected to the policy server {event.uri} ({shape}) in {self.runner.settings.mode}"
                return Note("warn", f"{where}: {ONE_STEP_CHUNKS}")
            return Note("info", f"connected to the policy server {event.uri} ({shape})")
        if isinstance(event, ChunkReceived):
            if event.epoch != self.epoch:
                return None
            fitted = self._answer_fits()
            if self.runner.on_chunk(event.tag, event.chunk.actions) == "stale":
                return Note(
                    "warn",
                    f"a chunk arrived after its last step ({event.round_trip_s * 1000:.0f} ms): dropped",
                    repeats="stale",
                )
            return fitted
        if isinstance(event, AnswerRejected):
            if event.epoch == self.epoch:
                self.runner.on_rejected(event.tag)
            delay = self._retry.next_delay()
            self._retry_at = self._clock() + delay
            if event.detail == self.problem:
                return None  # said already; the backoff keeps the retries few
            self.problem = event.detail
            return Note(
                "error",
                f"the policy server's answer was rejected, nothing of it runs: {event.detail}. Asking again "
                f"with backoff (in {delay:.1f} s, then up to policy.reconnect_max_s) and saying it once: if "
                "answers keep being rejected, the server does not serve the policy this robot is configured "
                "for (policy.action_horizon, policy.action_dim)",
            )
        if isinstance(event, ServerTraceback):
            # the end of a traceback says what failed; a megabyte of it says no more
            text = event.text if len(event.text) <= _TRACEBACK_CHARS else "...\n" + event.text[-_TRACEBACK_CHARS:]
            return Note("error", f"the policy server failed; its traceback:\n{text}")
        if isinstance(event, PolicyDisconnected):
            if event.epoch == self.epoch:
                self.epoch = None
                self.runner.on_link_lost()
            return Note("warn", f"policy server connection lost: {event.detail}; idling until it is back")
        if isinstance(event, ConnectFailed):
            return Note(
                "warn",
                f"cannot reach the policy server: {event.detail}; retrying in {event.retry_in_s:.1f} s",
                repeats="unreachable",
            )
        if isinstance(event, Notice):
            return Note("warn", event.text)
        raise AssertionError(f"unknown event {event!r}")

    def _answer_fits(self) -> Note | None:
        """A valid answer came: requests go at the runner's pace again."""
        self._retry.reset()
        self._retry_at = -math.inf
        if not self.problem:
            return None
        self.problem = ""
        return Note("info", "the policy server's answers fit the configuration now")

    def hold(self) -> None:
        """The robot stops stepping (pause, dead-man, reset): nothing planned before runs after."""
        self.runner.hold()

    def tick(self, observe: Callable[[], Mapping[str, Any] | None]) -> Tick:
        """One control tick. ``observe`` reads the sources the layout names, or None if they are not ready."""
        action = self.runner.step()
        if self.epoch is not None and self.runner.request_overdue():
            # the server holds the only request this connection may have: reconnect
            bound, setting = self.runner.answer_bound()
            epoch, self.epoch = self.epoch, None
            self.runner.abandon()
            self.runner.on_link_lost()
            why = f"no answer within {bound:g} s (policy.{setting}): the link is dead"
            return Tick(action, abort=(epoch, why))
        if self.epoch is None or not self.runner.wants_request() or self._clock() < self._retry_at:
            return Tick(action)
        values = observe()
        if values is None:
            return Tick(action)  # not ready: ask again next tick
        tag = self.runner.requested()
        return Tick(action, Request(self.epoch, self.layout.build(values), tag))
