"""Deploy mode: the robot side driven by a policy server (openpi's contract), one connection per robot.

The mode owns the policy links (:class:`plugrl_ros.protocol.policy.link.PolicyLinks`,
one asyncio thread for every robot's connection) and, per robot, a
:class:`plugrl_ros.policy.deploy.DeployRobot` that decides what each control
tick applies and when to ask for the next chunk. Each tick of the control
timer steps every robot that may move: a robot paused, reset or with a stale
source does not step at all (its chunks are dropped, its actuators idle),
since ticks are counted and a chunk kept across a stop would replay steps
whose moment passed. Deploy mode runs on the control timer only.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from rclpy.node import Node

from plugrl_ros.node.diagnostics import ERROR, OK, WARN, Entry
from plugrl_ros.policy.deploy import DeployRobot
from plugrl_ros.policy.runner import PolicyRunner
from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.protocol.policy.link import PolicyLinks
from plugrl_ros.robot.robot_side import RobotSide
from plugrl_ros.ros.config import BridgeConfig

EXIT_OK = 0
# A guard condition triggered from another thread can, rarely, fail to wake the executor;
# a slow timer drains whatever such a lost wakeup left behind (as the trainer link does).
_FALLBACK_DRAIN_S = 0.5
_WARN_THROTTLE_S = 5.0


def source_values(row: ObservationRow) -> dict[str, Any]:
    """An observation as the request layout names its sources: ``images.<name>``, ``states.<name>``, ``text``."""
    values: dict[str, Any] = {f"images.{name}": image for name, image in row.images.items()}
    values.update({f"states.{name}": state for name, state in row.states.items()})
    values["text"] = row.text
    return values


class DeployMode:
    """Policy-server stepping of ``robot``; it runs until the node is stopped."""

    def __init__(self, node: Node, config: BridgeConfig, robot: RobotSide, callback_group: object) -> None:
        policy = config.policy
        assert policy is not None and config.mode == "deploy" and config.control.mode == "timer"
        self._node = node
        self.config = config
        self.robot = robot
        self.lockstep = False
        self.finished = False  # a policy server has no end of run: Ctrl-C ends deploy mode
        self.exit_code = EXIT_OK
        n = len(config.envs)
        expect = policy.expectation(min_width=config.action_width_needed)
        self.robots = [
            DeployRobot(PolicyRunner(policy.execution, config.control.period_s, time.monotonic), policy.layout)
            for _ in range(n)
        ]
        self.ticks: deque[float] = deque(maxlen=1000)
        self.held = [True] * n  # not stepping (paused, resetting, stale): chunks dropped, actuators idle
        self._guard = node.create_guard_condition(self._deliver, callback_group=callback_group)
        node.create_timer(_FALLBACK_DRAIN_S, self._deliver, callback_group=callback_group)
        self.links = PolicyLinks([policy.server] * n, [expect] * n, wake=self._guard.trigger)
        node.create_timer(config.control.period_s, self._on_tick, callback_group=callback_group)

    def start(self) -> None:
        self.links.start()

    def stop(self) -> None:
        """Close every policy connection with 1000 (after the robot side idled the actuators)."""
        self.links.stop()
        self.links.join(self.config.policy.server.open_timeout_s + 1.0)

    def on_input(self, env: int) -> None:
        """Timer mode: a message only updates the env's sources, read at the next tick."""

    def on_pause(self, paused: bool) -> None:
        if paused:
            for deploy in self.robots:
                deploy.hold()

    # -- policy link events ---------------------------------------------------

    def _deliver(self) -> None:
        log = self._node.get_logger()
        for index, event in self.links.drain():
            note = self.robots[index].on_event(event)
            if note is None:
                continue
            text = f"[{self._env_name(index)}] {note.text}"
            if note.level == "error":
                log.error(text)
            elif note.level == "warn":
                log.warning(text, throttle_duration_sec=_WARN_THROTTLE_S)
            else:
                log.info(text)

    def _env_name(self, index: int) -> str:
        return self.config.envs[index] or f"env {index}"

    # -- stepping ---------------------------------------------------------------

    def _on_tick(self) -> None:
        robot = self.robot
        robot.check_pause()
        now_ns = robot.now_ns()
        self.ticks.append(now_ns * 1e-9)
        stamp = robot.stamp()
        for io in robot.envs:
            i = io.index
            if robot.paused or io.resetting or io.stale_sources(now_ns):
                if not self.held[i]:
                    self.robots[i].hold()
                    self.held[i] = True
                robot.idle(i, stamp)
                continue
            self.held[i] = False
            step = self.robots[i].tick(lambda i=i: self._observe(i, now_ns))
            if step.action is None:
                robot.idle(i, stamp)
            else:
                robot.publish(i, step.action, stamp)
            if step.request is not None:
                self.links.request(i, step.request.epoch, step.request.observation, step.request.tag)
            if step.abort is not None:
                self.links.abort(i, *step.abort)

    def _observe(self, env: int, now_ns: int) -> dict[str, Any] | None:
        row = self.robot.observe(env, now_ns)
        return None if row is None else source_values(row)

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
            entry = Entry(
                f"{prefix}: env {io.index} ({self._env_name(io.index)})", values=deploy.runner.stats().values()
            )
            stale = io.stale_sources(now_ns)
            if stale:
                entry.worse(WARN, "stale: " + "; ".join(stale))
            elif self.robot.paused:
                entry.message = "paused"
            elif deploy.epoch is None:
                entry.worse(WARN, "waiting for the policy server connection")
            else:
                entry.level, entry.message = OK, "running"
            entries.append(entry)
        return entries

    def status_line(self) -> str:
        """The periodic one-line status: connections, rate, and each robot's runner summary."""
        connected = sum(deploy.epoch is not None for deploy in self.robots)
        robots = "; ".join(
            f"{self._env_name(i)}: {deploy.runner.stats().summary()}" for i, deploy in enumerate(self.robots)
        )
        return f"policy server {connected}/{len(self.robots)} connected | {self.achieved_rate():.1f} Hz | {robots}" + (
            " | PAUSED" if self.robot.paused else ""
        )
