"""Teleop mode: no trainer and no policy; a person drives the robots through the intervention source.

Demonstrations: everything is recorded as in the other modes (with
``record.path``), episodes delimited by the same reward, done and reset topics
and ``episode.max_steps`` (:mod:`plugrl_ros.policy.episodes` counts them, as in
deploy mode). Each control tick, for each robot that may move (not paused, not
resetting, its sensors fresh): while the person commands (the takeover rule of
``intervention``), the observation of that moment is recorded and the person's
command goes out through the actuators' limits; otherwise the actuators idle.
An episode begins with the person's first command after a reset and then
counts every tick (the world moves on while the person rests), as deploy mode
counts ticks spent waiting for a chunk.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import numpy as np
from rclpy.node import Node

from plugrl_ros.policy.episodes import EpisodeEnd, EpisodeTracker, Phase
from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.robot.robot_side import RobotSide
from plugrl_ros.robot.status import OK, WARN, Entry, env_condition, person_values, share
from plugrl_ros.robot.takeover import Control
from plugrl_ros.ros.config import BridgeConfig
from plugrl_ros.thread_guard import Crash

EXIT_OK = 0


class TeleopObserver(Protocol):
    """What teleop mode tells an observer (the recorder): the calls deploy mode makes, minus the link's."""

    def observation(self, env: int, t_ns: int, row: ObservationRow, sent_in: Literal["infer", "feedback"]) -> None: ...
    def step(
        self,
        env: int,
        t_ns: int,
        chunk_step: int | None,
        commanded: Mapping[str, np.ndarray | None],
        applied: np.ndarray | None = None,
        intervention: tuple[bool, bool, np.ndarray | None] | None = None,
    ) -> None: ...
    def step_result(
        self, env: int, t_ns: int, reward: float, terminated: bool, truncated: bool, success: bool
    ) -> None: ...
    def episode_end(self, env: int, t_ns: int, ret: float, length: int, success: bool) -> None: ...


class TeleopMode:
    """A person drives ``robot`` through the intervention source; it runs until the node is stopped."""

    def __init__(
        self,
        node: Node,
        config: BridgeConfig,
        robot: RobotSide,
        callback_group: object,
        observer: TeleopObserver | None = None,
        on_crash: Callable[[Crash], None] | None = None,
    ) -> None:
        """``on_crash`` is taken as every mode takes it; teleop runs no thread of its own to guard."""
        del on_crash
        assert config.intervention is not None and config.control.mode == "timer" and robot.people is not None
        self._node = node
        self.config = config
        self.robot = robot
        self.observer = observer
        self.lockstep = False
        self.finished = False  # a person has no end of run: Ctrl-C ends teleop mode
        self.exit_code = EXIT_OK
        n = len(config.envs)
        self.episodes = [
            EpisodeTracker(config.episode.max_steps, config.reset.mode != "none", config.reset.on_start)
            for _ in range(n)
        ]
        self.person_steps = [0] * n
        self.commanded_ticks = [0] * n  # ticks the robot could move (not paused, resetting, stale)
        self.ticks: deque[float] = deque(maxlen=1000)
        node.create_timer(config.control.period_s, self._on_tick, callback_group=callback_group)

    # -- the Mode interface (plugrl_ros.node.mode) -------------------------------

    def start(self) -> None:
        """Nothing to connect: the person's device is subscribed by the robot side."""

    def stop(self) -> None:
        """Nothing to close (the robot side has idled the actuators)."""

    def on_input(self, env: int) -> None:
        """Timer mode: a message only updates the env's sources, read at the next tick."""

    def on_pause(self, paused: bool) -> None:
        """Paused: every running episode is truncated (as in the other modes)."""
        if paused:
            for i, episode in enumerate(self.episodes):
                reward, _, _, success = self.robot.step_result(i)
                end = episode.truncate(reward, success)
                if end is not None:
                    if self.observer is not None:
                        self.observer.step_result(i, self.robot.now_ns(), reward, False, True, success)
                    self._episode_ended(i, end, "paused")

    def describe(self) -> str:
        person = self.config.intervention
        assert person is not None
        return f"teleop: a person drives through {person.source} ({person.takeover} takeover), no trainer, no policy"

    # -- stepping ------------------------------------------------------------------

    def _on_tick(self) -> None:
        robot = self.robot
        robot.check_pause()
        robot.tend()
        now_ns = robot.now_ns()
        self.ticks.append(now_ns * 1e-9)
        stamp = robot.stamp()
        for io in robot.envs:
            i = io.index
            episode = self.episodes[i]
            if episode.phase is Phase.RESETTING:
                self._idle(i, now_ns, stamp, False)
                if robot.reset(i):  # started on the first call; never while paused
                    episode.reset_done()
                continue
            if robot.paused or io.stale_sources(now_ns):
                self._idle(i, now_ns, stamp, False)
                continue
            if episode.running:
                result = robot.step_result(i)
                end = episode.result(*result)
                if self.observer is not None:
                    reward, terminated, truncated, success = result
                    if end is not None:
                        terminated, truncated = end.terminated, not end.terminated
                    self.observer.step_result(i, now_ns, reward, terminated, truncated, success)
                if end is not None:
                    self._episode_ended(i, end, "terminated" if end.terminated else "truncated")
                    self._idle(i, now_ns, stamp, False)
                    continue
            self.commanded_ticks[i] += 1
            command = robot.person_command(i) if robot.control(i) is Control.PERSON else None
            row = None if command is None else robot.observe(i, now_ns, starting=True)
            if command is None or row is None:  # the person rests (or cannot be heard): idle
                self._idle(i, now_ns, stamp, True)
                if episode.running:
                    episode.stepped()  # the world moves on while the person rests
                continue
            if episode.running:
                episode.stepped()
            else:
                robot.begin_window(i)  # the episode's rewards and done flags count from its first command
                episode.begin()
            self.person_steps[i] += 1
            sent = robot.publish(i, command, stamp)
            if self.observer is not None:
                self.observer.observation(i, now_ns, row, "infer")  # what the person's command answered
                self.observer.step(i, now_ns, None, sent, command, (True, True, command))

    def _idle(self, env: int, now_ns: int, stamp: Any, resting: bool) -> None:
        """``resting``: the robot could move, but the person does not command it (recorded as replaced)."""
        sent = self.robot.idle(env, stamp)
        if self.observer is not None:
            self.observer.step(env, now_ns, None, sent, None, (False, resting, None))

    def _episode_ended(self, env: int, end: EpisodeEnd, how: str) -> None:
        if self.observer is not None:
            self.observer.episode_end(env, self.robot.now_ns(), end.ret, end.length, end.success)
        tracker = self.episodes[env]
        after = "resetting" if tracker.phase is Phase.RESETTING else "no reset (reset.mode none)"
        self._node.get_logger().info(
            f"[{self._env_name(env)}] demonstration {tracker.episodes} {how} after {end.length} steps: "
            f"return {end.ret:.3f}{', success' if end.success else ''}; {after}"
        )

    def _env_name(self, index: int) -> str:
        return self.config.envs[index] or f"env {index}"

    # -- status --------------------------------------------------------------------

    def achieved_rate(self) -> float:
        """Control ticks per second over the last 5 s of the node's clock."""
        window = [t for t in self.ticks if self.ticks and t >= self.ticks[-1] - 5.0]
        return 0.0 if len(window) < 2 else (len(window) - 1) / (window[-1] - window[0])

    def diagnostics(self, prefix: str) -> list[Entry]:
        """The control loop, then one entry per robot: its episodes and who commands it."""
        config = self.config
        rate = self.achieved_rate()
        loop = Entry(f"{prefix}: control")
        loop.values = {
            "mode": "timer (teleop)",
            "target rate Hz": f"{config.control.rate_hz:g}",
            "achieved rate Hz": f"{rate:.1f}",
            "paused": str(self.robot.paused),
        }
        if self.robot.paused:
            loop.worse(WARN, "paused")
        elif rate and rate < 0.9 * config.control.rate_hz:
            loop.worse(WARN, f"control rate {rate:.1f} Hz below target {config.control.rate_hz:g} Hz")
        entries = [loop]
        now_ns = self.robot.now_ns()
        for io in self.robot.envs:
            i = io.index
            episode = self.episodes[i]
            control = self.robot.control(i)
            entry = Entry(
                f"{prefix}: env {i} ({self._env_name(i)})",
                values={
                    "demonstrations": str(episode.episodes),
                    "successes": str(episode.successes),
                    "episode": episode.phase.value + (f", step {episode.length}" if episode.running else ""),
                    "reset failures": str(io.reset.total_failures),
                    **person_values(control.value, self.person_steps[i], self.commanded_ticks[i]),
                },
            )
            condition = env_condition(io, self.robot.paused, now_ns, time.monotonic())
            if condition is not None:
                entry.level, entry.message = condition
            elif control is Control.SILENT:
                entry.worse(WARN, "the person's device went silent while held: idle")
            else:
                entry.level, entry.message = OK, "driven by the person" if control is Control.PERSON else "idle"
            entries.append(entry)
        return entries

    def status_line(self) -> str:
        """The periodic one-line status: rate, and each robot's demonstrations and the person's share."""
        robots = "; ".join(
            f"{self._env_name(i)}: {episode.episodes} demonstrations ({episode.successes} successes), "
            f"person share {share(self.person_steps[i], self.commanded_ticks[i])}"
            for i, episode in enumerate(self.episodes)
        )
        return f"teleop | {self.achieved_rate():.1f} Hz | {robots}" + (" | PAUSED" if self.robot.paused else "")
