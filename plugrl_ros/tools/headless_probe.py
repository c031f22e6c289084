"""The headless probe: probe envs stepped in-process against the real client stack, no ROS.

It drives the same rollout core and websocket client as the bridge node, so
a trainer link (and this package's protocol handling) can be checked from any
machine with Python: ``plugrl-probe --headless --server ws://HOST:PORT``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from plugrl_ros import stop_request
from plugrl_ros.protocol.client import (
    ClientSettings,
    CloseKind,
    Connected,
    ConnectFailed,
    Disconnected,
    Event,
    FrameReceived,
    Notice,
    TrainerClient,
)
from plugrl_ros.protocol.messages import ObservationRow, TextFormat
from plugrl_ros.rollout.rollout import Rollout, RolloutSettings
from plugrl_ros.tools.probe_env import ProbeEnvs

log = logging.getLogger("plugrl_ros.probe")

EXIT_OK = 0
EXIT_FATAL = 1


@dataclass(frozen=True)
class HeadlessSettings:
    client: ClientSettings
    n_envs: int = 1
    steps: int | None = None  # stop by ourselves after this many feedbacks
    action_dim: int | None = None  # when the trainer does not announce action_dim
    replan_steps: int = 0
    max_episode_steps: int = 0
    use_reuse: bool = True
    text_format: TextFormat = "array"


class InProcessEnvs(Protocol):
    """What the headless client steps: the probe envs, or any envs with their interface (plugrl_ros.gym's)."""

    n: int
    action_dim: int

    def step(self, env: int, action: np.ndarray) -> tuple[float, bool] | tuple[float, bool, bool]:
        """(reward, terminated) or (reward, terminated, truncated)."""
        ...

    def reset(self, env: int) -> None: ...

    def row(self, env: int) -> ObservationRow: ...


class HeadlessProbe:
    """Runs ``n_envs`` probe envs (or what ``make_envs`` makes) against a trainer until the run ends (or ``steps``
    feedbacks)."""

    def __init__(self, settings: HeadlessSettings, make_envs: Callable[[int, int], InProcessEnvs] = ProbeEnvs) -> None:
        self.settings = settings
        self._make_envs = make_envs
        self.rollout = Rollout(
            RolloutSettings(
                n_envs=settings.n_envs,
                action_width=settings.action_dim,
                replan_steps=settings.replan_steps,
                max_episode_steps=settings.max_episode_steps,
                use_reuse=settings.use_reuse,
                text_format=settings.text_format,
            ),
            clock=time.monotonic,
        )
        self.client = TrainerClient(settings.client, self.on_event)
        self.envs: InProcessEnvs | None = None
        self.feedbacks = 0
        self.error: str | None = None

    async def run(self) -> int:
        """Run to the end; the process exit status (0 after a stop or ``steps`` feedbacks)."""
        kind = await self.client.run()
        if self.error is not None:
            log.error("%s", self.error)
            return EXIT_FATAL
        if kind is CloseKind.FATAL:
            log.error("fatal: %s", self.client.fatal_detail)
            return EXIT_FATAL
        if kind is CloseKind.STOP:
            log.info("the trainer finished the run (plugrl-server-stop); %d feedbacks sent", self.feedbacks)
        else:
            log.info("stopped after %d feedbacks", self.feedbacks)
        return EXIT_OK

    def on_event(self, event: Event) -> None:
        if isinstance(event, FrameReceived):
            self._on_frame(event)
        elif isinstance(event, Connected):
            log.info("connected to %s (connection %d)", event.uri, event.epoch)
            self.rollout.on_connected(event.epoch)
        elif isinstance(event, Disconnected):
            lost = self.rollout.on_disconnected(event.epoch)
            dropped = f"; dropped the chunks of envs {list(lost)}" if lost else ""
            log.info("disconnected: %s (%s)%s", event.kind.value, event.detail, dropped)
        elif isinstance(event, ConnectFailed):
            log.warning("cannot reach the trainer: %s; retrying in %.1f s", event.detail, event.retry_in_s)
        elif isinstance(event, Notice):
            log.warning("%s", event.text)

    def _on_frame(self, event: FrameReceived) -> None:
        result = self.rollout.on_frame(event.epoch, event.frame)
        if result.kind == "error":
            log.error("the trainer broke the protocol: %s; reconnecting", result.detail)
            self.client.abort(event.epoch, result.detail)
            return
        if result.kind == "metadata" and result.metadata is not None:
            log.info("trainer: %s", result.metadata.describe() or "{} (announces nothing)")
            if not self._ensure_envs():
                return
        self._advance(event.epoch)

    def _ensure_envs(self) -> bool:
        width = self.rollout.expected_width
        if width is None:
            self.error = "the trainer does not announce action_dim; pass --action-dim"
            self.client.stop()
            return False
        if self.envs is None:
            self.envs = self._make_envs(self.settings.n_envs, width)
        elif self.envs.action_dim != width:
            self.error = f"the trainer now announces action_dim {width}, but the probe envs have {self.envs.action_dim}"
            self.client.stop()
            return False
        return True

    def _advance(self, epoch: int) -> None:
        """Step every env through its chunk, then send what the scheduler allows."""
        envs, rollout = self.envs, self.rollout
        if envs is None:
            return
        for i in range(envs.n):
            while (action := rollout.take_step(i)) is not None:
                reward, terminated, *truncated = envs.step(i, action)
                rollout.finish_step(i, reward, terminated, bool(truncated and truncated[0]), False, envs.row(i))
            if rollout.needs_reset(i):
                # The terminal observation is already captured; resetting now,
                # while its feedback may still be held, is what a robot does.
                envs.reset(i)
                rollout.reset_done(i)
        for outgoing in rollout.poll(envs.row):
            self.client.send(epoch, outgoing)
            if outgoing.kind == "feedback":
                self.feedbacks += 1
        if self.settings.steps is not None and self.feedbacks >= self.settings.steps:
            self.client.stop()


def run_headless(settings: HeadlessSettings) -> int:
    """Run the headless probe to completion (or Ctrl-C/SIGTERM: then it stops, closing with 1000); the exit status."""

    async def run() -> int:
        probe = HeadlessProbe(settings)
        with stop_request.calling_in_loop(asyncio.get_running_loop(), probe.client.stop):
            return await probe.run()

    stop_request.install()
    return asyncio.run(run())
