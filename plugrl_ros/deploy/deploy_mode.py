"""Deploy mode: the robot side driven by a policy server (openpi's contract), one connection per robot.

The mode owns the policy links (:class:`plugrl_ros.protocol.policy.link.PolicyLinks`,
one asyncio thread for every robot's connection) and, per robot, a
:class:`plugrl_ros.policy.deploy.DeployRobot` that decides what each control
tick applies and when to ask for the next chunk. Each tick of the control
timer steps every robot that may move: a robot paused, reset or with a stale
source does not step at all (its chunks are dropped, its actuators idle),
since ticks are counted and a chunk kept across a stop would replay steps
whose moment passed. Deploy mode runs on the control timer only.

Episodes are counted as in train mode, from the same ``reward`` and
``episode`` topics (:mod:`plugrl_ros.policy.episodes` says when one begins
and ends): when one ends the robot's chunks are dropped, its reset runs
(``reset.mode``), and its policy starts again from a fresh observation.
Returns and successes go to /diagnostics and the log, never to the server.

When recording, an observer (the recorder) hears each observation as sent,
each answer and what became of it, each tick's applied action and commands,
the step results and episode ends, and the links' events; it never steers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rclpy.node import Node

from plugrl_ros.deploy.observer import PolicyObserver
from plugrl_ros.policy.deploy import DeployRobot
from plugrl_ros.policy.episodes import EpisodeEnd, EpisodeTracker, Phase
from plugrl_ros.policy.runner import PolicyRunner
from plugrl_ros.protocol.backoff import Backoff
from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.protocol.policy.client import (
    AnswerRejected,
    ChunkReceived,
    Event,
    PolicyConnected,
    PolicyDisconnected,
    ServerTraceback,
)
from plugrl_ros.protocol.policy.link import PolicyLinks
from plugrl_ros.robot.robot_side import RobotSide
from plugrl_ros.robot.status import ERROR, OK, WARN, Entry, env_condition, person_values, share
from plugrl_ros.robot.takeover import Control
from plugrl_ros.ros.config import BridgeConfig
from plugrl_ros.ros.wakeup import Wakeup
from plugrl_ros.thread_guard import Crash, log_crash

EXIT_OK = 0
# How often a slow timer drains what a lost wakeup left behind (see plugrl_ros.ros.wakeup).
_FALLBACK_DRAIN_S = 0.5
_WARN_THROTTLE_S = 5.0
_TRACEBACK_CHARS = 8000  # of a server's traceback, recorded (its end says what failed)


def source_values(row: ObservationRow) -> dict[str, Any]:
    """An observation as the request layout names its sources: ``images.<name>``, ``states.<name>``, ``text``."""
    values: dict[str, Any] = {f"images.{name}": image for name, image in row.images.items()}
    values.update({f"states.{name}": state for name, state in row.states.items()})
    values["text"] = row.text
    return values


class DeployMode:
    """Policy-server stepping of ``robot``; it runs until the node is stopped."""

    def __init__(
        self,
        node: Node,
        config: BridgeConfig,
        robot: RobotSide,
        callback_group: object,
        observer: PolicyObserver | None = None,
        on_crash: Callable[[Crash], None] = log_crash,
    ) -> None:
        """``observer`` (the recorder, when recording) hears every request, answer and step; it never steers.
        ``on_crash``: told if the link thread dies of an error nobody expected (see :mod:`plugrl_ros.thread_guard`)."""
        policy = config.policy
        assert policy is not None and config.mode == "deploy" and config.control.mode == "timer"
        self._node = node
        self.config = config
        self.robot = robot
        self.observer = observer
        # the sources a request carries: what is recorded as the observation sent
        self._sent = {item.source for item in policy.layout.inputs}
        self._captured: dict[int, ObservationRow] = {}  # this tick's observation, per robot (when recording)
        self.lockstep = False
        self.finished = False  # a policy server has no end of run: Ctrl-C ends deploy mode
        self.exit_code = EXIT_OK
        n = len(config.envs)
        expect = policy.expectation(min_width=config.action_width_needed)
        self.robots = [
            DeployRobot(
                PolicyRunner(policy.execution, config.control.period_s, time.monotonic),
                policy.layout,
                Backoff(policy.server.reconnect_initial_s, policy.server.reconnect_max_s),
            )
            for _ in range(n)
        ]
        self.episodes = [
            EpisodeTracker(config.episode.max_steps, config.reset.mode != "none", config.reset.on_start)
            for _ in range(n)
        ]
        self.ticks: deque[float] = deque(maxlen=1000)
        self._warned: dict[tuple[int, str], float] = {}  # (robot, repeating kind) -> when last logged
        self.held = [True] * n  # not stepping (paused, resetting, stale): chunks dropped, actuators idle
        self.person_steps = [0] * n  # ticks a person commanded, per robot
        self.commanded_ticks = [0] * n  # ticks the policy or a person commanded (not paused, resetting, stale)
        # what the recorder hears of a step the policy (or its idle) commanded, with a person in the loop
        self._policy_step = None if robot.people is None else (False, False, None)
        wakeup = Wakeup(node, self._deliver, callback_group, _FALLBACK_DRAIN_S)
        self.links = PolicyLinks([policy.server] * n, [expect] * n, wake=wakeup.trigger, on_crash=on_crash)
        node.create_timer(config.control.period_s, self._on_tick, callback_group=callback_group)

    def start(self) -> None:
        self.links.start()

    def stop(self) -> None:
        """Close every policy connection with 1000 (after the robot side idled the actuators)."""
        if self.observer is not None:
            now_ns = self.robot.now_ns()
            for i, deploy in enumerate(self.robots):
                counts = {k: v for k, v in asdict(deploy.runner.stats()).items() if isinstance(v, int)}
                self.observer.link_event(now_ns, "counts", deploy.epoch or 0, detail={"env": i, **counts})
        self.links.stop()
        self.links.join(self.config.policy.server.open_timeout_s + 1.0)
        # The executor no longer spins: each connection's close is handled here, so the recording and the log
        # end with it. Answers are dropped: the actuators are idle for good.
        self._deliver(stopping=True)

    def on_input(self, env: int) -> None:
        """Timer mode: a message only updates the env's sources, read at the next tick."""

    def describe(self) -> str:
        return f"policy server {self.config.policy.server.uri} ({self.config.policy.execution.mode})"

    def on_pause(self, paused: bool) -> None:
        """Paused: every robot's chunks are dropped and its running episode is truncated (as in train mode)."""
        if paused:
            for i, deploy in enumerate(self.robots):
                deploy.hold()
                reward, _, _, success = self.robot.step_result(i)
                end = self.episodes[i].truncate(reward, success)
                if end is not None:
                    if self.observer is not None:
                        self.observer.step_result(i, self.robot.now_ns(), reward, False, True, success)
                    self._episode_ended(i, end, "paused")

    # -- policy link events ---------------------------------------------------

    def _deliver(self, stopping: bool = False) -> None:
        """Hand the links' events to each robot's runner, the recording and the log (``stopping``: the bridge
        closed the links; only connects and closes are taken, and a close is no loss)."""
        log = self._node.get_logger()
        for index, event in self.links.drain():
            if stopping and not isinstance(event, PolicyConnected | PolicyDisconnected):
                continue
            deploy = self.robots[index]
            if self.observer is not None:
                current, planned = deploy.epoch, deploy.runner.planned()
            note = deploy.on_event(event)
            if self.observer is not None:
                self._observe_event(index, event, current, planned)
            if note is None:
                continue
            if stopping and isinstance(event, PolicyDisconnected):
                log.info(f"[{self._env_name(index)}] policy server connection closed ({event.detail})")
                continue
            text = f"[{self._env_name(index)}] {note.text}"
            if note.level == "error":
                log.error(text)
            elif note.level == "warn":
                # throttled per robot and kind (rclpy's throttle is per call site: a stream of rejected
                # answers would hide why a connection was closed)
                if note.repeats:
                    now = time.monotonic()
                    key = (index, note.repeats)
                    if now - self._warned.get(key, -_WARN_THROTTLE_S) < _WARN_THROTTLE_S:
                        continue
                    self._warned[key] = now
                log.warning(text)
            else:
                log.info(text)

    def _env_name(self, index: int) -> str:
        return self.config.envs[index] or f"env {index}"

    # -- stepping ---------------------------------------------------------------

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
                self._hold(i)
                self._idle(i, now_ns, stamp)
                if robot.reset(i):  # started on the first call; never while paused
                    episode.reset_done()
                continue
            if robot.paused or io.stale_sources(now_ns):
                self._hold(i)
                self._idle(i, now_ns, stamp)
                continue
            if episode.running:
                result = robot.step_result(i)
                end = episode.result(*result)
                if self.observer is not None:
                    self._observe_result(i, now_ns, result, end)
                if end is not None:
                    self._episode_ended(i, end, "terminated" if end.terminated else "truncated")
                    self._idle(i, now_ns, stamp)
                    continue
            self.commanded_ticks[i] += 1
            control = robot.control(i)
            if control is not Control.POLICY:
                self._person_step(i, control, now_ns, stamp)
                continue
            self.held[i] = False
            deploy = self.robots[i]
            asked = deploy.runner.pending_request
            step = deploy.tick(lambda i=i: self._observe(i, now_ns))
            if step.action is None:
                self._idle(i, now_ns, stamp)
                if episode.running:
                    episode.stepped()  # the world moves on while the robot waits for a chunk
            else:
                if episode.running:
                    episode.stepped()
                else:
                    robot.begin_window(i)  # the episode's rewards and done flags count from its first action
                    episode.begin()
                sent = robot.publish(i, step.action, stamp)
                if self.observer is not None:
                    self.observer.step(i, now_ns, deploy.runner.row, sent, step.action, self._policy_step)
            if step.request is not None:
                self.links.request(i, step.request.epoch, step.request.observation, step.request.tag)
                if self.observer is not None:
                    self._observe_sent(i, now_ns)
            if step.abort is not None:
                self.links.abort(i, *step.abort)
                if self.observer is not None and asked is not None:
                    self.observer.answer(i, now_ns, "abandoned", asked, detail=step.abort[1])

    def _person_step(self, env: int, control: Control, now_ns: int, stamp: Any) -> None:
        """A person commands ``env`` (or their device went silent while held: idle). The policy's chunks are
        dropped and any answer on its way discarded, so when the person lets go the robot idles until a chunk
        computed for an observation taken after that arrives."""
        self._hold(env)
        command = self.robot.person_command(env) if control is Control.PERSON else None
        episode = self.episodes[env]
        if command is None:
            sent = self.robot.idle(env, stamp)
            if self.observer is not None:
                self.observer.step(env, now_ns, None, sent, None, (False, True, None))
            if episode.running:
                episode.stepped()  # the world moves on while the robot idles
            return
        if episode.running:
            episode.stepped()
        else:
            self.robot.begin_window(env)  # the episode's rewards and done flags count from its first action
            episode.begin()
        self.person_steps[env] += 1
        sent = self.robot.publish(env, command, stamp)
        if self.observer is not None:
            self.observer.step(env, now_ns, None, sent, command, (True, True, command))

    def _idle(self, env: int, now_ns: int, stamp: Any) -> None:
        sent = self.robot.idle(env, stamp)
        if self.observer is not None:
            self.observer.step(env, now_ns, None, sent, None, self._policy_step)

    def _hold(self, env: int) -> None:
        if not self.held[env]:
            self.robots[env].hold()
            self.held[env] = True

    def _episode_ended(self, env: int, end: EpisodeEnd, how: str) -> None:
        """Drop the robot's chunks (the next episode starts from a fresh observation) and log the episode."""
        self._hold(env)
        if self.observer is not None:
            self.observer.episode_end(env, self.robot.now_ns(), end.ret, end.length, end.success)
        tracker = self.episodes[env]
        after = "resetting" if tracker.phase is Phase.RESETTING else "no reset (reset.mode none)"
        self._node.get_logger().info(
            f"[{self._env_name(env)}] episode {tracker.episodes} {how} after {end.length} steps: "
            f"return {end.ret:.3f}{', success' if end.success else ''}; {after}"
        )

    def _observe(self, env: int, now_ns: int) -> dict[str, Any] | None:
        row = self.robot.observe(env, now_ns, starting=True)
        if row is None:
            return None
        if self.observer is not None:
            self._captured[env] = row
        return source_values(row)

    # -- observing (the recorder hears everything; it never steers) -------------

    def _observe_sent(self, env: int, now_ns: int) -> None:
        """The observation a request just carried: the sources its layout names, under their source names."""
        assert self.observer is not None
        row = self._captured.pop(env)
        sent = self._sent
        sent_row = ObservationRow(
            images={k: v for k, v in row.images.items() if f"images.{k}" in sent},
            states={k: v for k, v in row.states.items() if f"states.{k}" in sent},
            text=row.text if "text" in sent else "",
        )
        self.observer.observation(env, now_ns, sent_row, "infer")

    def _observe_result(
        self, env: int, now_ns: int, result: tuple[float, bool, bool, bool], end: EpisodeEnd | None
    ) -> None:
        """A step's result as the episode took it: an episode cut at ``episode.max_steps`` is truncated."""
        assert self.observer is not None
        reward, terminated, truncated, success = result
        if end is not None:
            terminated, truncated = end.terminated, not end.terminated
        self.observer.step_result(env, now_ns, reward, terminated, truncated, success)

    def _observe_event(self, env: int, event: Event, current: int | None, planned: bool) -> None:
        """A link event of robot ``env``, whose connection was ``current`` and which had chunks or a request
        (``planned``) before the event."""
        observer = self.observer
        assert observer is not None
        now_ns = self.robot.now_ns()
        where = {"env": env}
        if isinstance(event, PolicyConnected):
            observer.link_event(now_ns, "connect", event.epoch, detail={**where, "uri": event.uri})
            observer.link_event(now_ns, "metadata", event.epoch, detail={**where, "metadata": event.metadata.raw})
        elif isinstance(event, ChunkReceived):
            runner = self.robots[env].runner
            observer.chunk(env, now_ns, event.chunk.actions)
            observer.latency(now_ns, event.round_trip_s)
            applied = event.epoch == current and runner.outcome == "applied"
            observer.answer(
                env,
                now_ns,
                runner.outcome if event.epoch == current else "unknown",
                int(event.tag),
                round_trip_s=event.round_trip_s,
                first_row=runner.first_row if applied else None,
                server_timing=event.chunk.server_timing,
            )
        elif isinstance(event, AnswerRejected):
            observer.answer(env, now_ns, "rejected", int(event.tag), detail=event.detail)
        elif isinstance(event, ServerTraceback):
            observer.link_event(
                now_ns, "traceback", event.epoch, detail={**where, "text": event.text[-_TRACEBACK_CHARS:]}
            )
        elif isinstance(event, PolicyDisconnected):
            lost = [env] if event.epoch == current and planned else []
            observer.link_event(
                now_ns, "close", event.epoch, code=event.code, reason=event.detail, dropped_envs=lost, detail=where
            )

    # -- status -----------------------------------------------------------------

    def achieved_rate(self) -> float:
        """Control ticks per second over the last 5 s of the node's clock."""
        ticks = self.ticks
        if len(ticks) < 2:
            return 0.0
        window = [t for t in ticks if t >= ticks[-1] - 5.0]
        if len(window) < 2:
            return 0.0
        return (len(window) - 1) / (window[-1] - window[0])

    def diagnostics(self, prefix: str) -> list[Entry]:
        """The policy link and control loop, then one entry per robot with its runner's counters."""
        config = self.config
        rate = self.achieved_rate()
        connected = sum(deploy.epoch is not None for deploy in self.robots)
        link = Entry(
            f"{prefix}: policy server",
            values={
                "uri": config.policy.server.uri,
                "connected robots": f"{connected}/{len(self.robots)}",
                "execution": config.policy.execution.mode,
            },
        )
        if connected < len(self.robots):
            link.worse(WARN if connected else ERROR, f"{len(self.robots) - connected} robot(s) not connected")
        loop = Entry(f"{prefix}: control")
        loop.values = {
            "mode": "timer (deploy)",
            "target rate Hz": f"{config.control.rate_hz:g}",
            "achieved rate Hz": f"{rate:.1f}",
            "paused": str(self.robot.paused),
        }
        if self.robot.paused:
            loop.worse(WARN, "paused")
        elif rate and rate < 0.9 * config.control.rate_hz:
            loop.worse(WARN, f"control rate {rate:.1f} Hz below target {config.control.rate_hz:g} Hz")
        entries = [link, loop]
        now_ns = self.robot.now_ns()
        for io, deploy in zip(self.robot.envs, self.robots, strict=True):
            episode = self.episodes[io.index]
            entry = Entry(
                f"{prefix}: env {io.index} ({self._env_name(io.index)})",
                values={**episode_values(episode, io.reset.total_failures), **deploy.runner.stats().values()},
            )
            if self.robot.people is not None:
                entry.values.update(
                    person_values(
                        self.robot.control(io.index).value,
                        self.person_steps[io.index],
                        self.commanded_ticks[io.index],
                    )
                )
            condition = env_condition(io, self.robot.paused, now_ns, time.monotonic())
            if condition is not None:
                entry.level, entry.message = condition
            elif deploy.epoch is None:
                entry.worse(WARN, "waiting for the policy server connection")
            elif deploy.problem:
                entry.worse(ERROR, f"the policy server's answers are rejected: {deploy.problem}")
            else:
                entry.level, entry.message = OK, "running"
            entries.append(entry)
        return entries

    def status_line(self) -> str:
        """The periodic one-line status: connections, rate, and each robot's runner summary."""
        connected = sum(deploy.epoch is not None for deploy in self.robots)
        robots = "; ".join(
            f"{self._env_name(i)}: {deploy.runner.stats().summary()}{episode_summary(self.episodes[i])}"
            + (
                ""
                if self.robot.people is None
                else f", person share {share(self.person_steps[i], self.commanded_ticks[i])}"
            )
            for i, deploy in enumerate(self.robots)
        )
        return f"policy server {connected}/{len(self.robots)} connected | {self.achieved_rate():.1f} Hz | {robots}" + (
            " | PAUSED" if self.robot.paused else ""
        )


def episode_values(episode: EpisodeTracker, reset_failures: int) -> dict[str, str]:
    """One robot's episode counters, for its /diagnostics entry (the same keys as train mode's where they match)."""
    mean, recent = episode.mean_return(), episode.recent_mean_return()
    return {
        "episodes": str(episode.episodes),
        "last return": "-" if episode.last is None else f"{episode.last.ret:.3f}",
        "mean return": "-" if mean is None else f"{mean:.3f}",
        "recent mean return": "-" if recent is None else f"{recent:.3f}",
        "successes": str(episode.successes),
        "episode": episode.phase.value + (f", step {episode.length}" if episode.running else ""),
        "reset failures": str(reset_failures),
    }


def episode_summary(episode: EpisodeTracker) -> str:
    """The status line's episode part: count and mean return, once an episode has ended."""
    mean = episode.mean_return()
    if mean is None:
        return ""
    return f", {episode.episodes} episodes (mean return {mean:.2f}, successes {episode.successes})"
