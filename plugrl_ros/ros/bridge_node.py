"""The bridge node: robots on ROS topics become PlugRL envs of one remote training run.

Wiring only: the protocol and scheduling rules live in the rollout core
(:mod:`plugrl_ros.rollout`), the per-robot ROS I/O in
:class:`plugrl_ros.ros.env_io.EnvIO`, the trainer connection in
:class:`plugrl_ros.ros.trainer_link.TrainerLink`. All callbacks run on one
single-threaded executor, so the core needs no locks.

Stepping (docs/design.md): in ``timer`` mode a wall-clock (or sim-clock) timer
publishes one action step per env per tick and samples each step's result at
a later tick; a new chunk's first step goes out as soon as it arrives (the
rule is :mod:`plugrl_ros.rollout.timer_steps`). In ``lockstep`` mode the next
step is published as soon as every source of the env has produced a message
newer than the last action.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import Bool
from std_srvs.srv import SetBool

from plugrl_ros import stop_request
from plugrl_ros.protocol.client import CloseKind, Connected, ConnectFailed, Disconnected, FrameReceived, Notice
from plugrl_ros.rollout.rollout import Rollout, RolloutSettings
from plugrl_ros.rollout.timer_steps import TimerSteps
from plugrl_ros.ros.config import BridgeConfig, check_environment
from plugrl_ros.ros.dead_man import DeadManSwitch
from plugrl_ros.ros.diagnostics import ERROR, OK, WARN, Entry, RateMeter, percentile_ms, status_array
from plugrl_ros.ros.env_io import EnvIO, ShapeGuard
from plugrl_ros.ros.node_parameters import configure
from plugrl_ros.ros.param_sources import explain_refusal
from plugrl_ros.ros.params import ConfigError
from plugrl_ros.ros.qos import qos_profile
from plugrl_ros.ros.trainer_link import Finished, LinkEvent, TrainerLink

NODE_NAME = "plugrl_bridge"
EXIT_OK = 0
EXIT_FATAL = 1
EXIT_CONFIG = 2

# Threads that convert images beside the executor (OpenCV releases the GIL): a small robot computer's cores.
_CONVERTER_THREADS = 2


class BridgeNode(Node):
    """One bridge: ``len(envs)`` robots sharing one trainer connection."""

    def __init__(self, command_line: Sequence[str] | None = None, **kwargs: Any) -> None:
        """``command_line``: what ``rclpy.init`` read (default ``sys.argv``), to name what rcl dropped."""
        super().__init__(NODE_NAME, **kwargs)
        self.config: BridgeConfig = configure(self, sys.argv if command_line is None else command_line)
        check_environment(self.config, os.environ)
        config = self.config
        self.finished = False
        self.exit_code = EXIT_OK
        self._group = MutuallyExclusiveCallbackGroup()
        self._lockstep = config.control.mode == "lockstep"
        self.rollout = Rollout(
            RolloutSettings(
                n_envs=len(config.envs),
                min_action_width=config.action_width_needed,
                refuse_wider=True,
                action_horizon=config.control.action_horizon or None,
                action_width=config.control.action_dim or None,
                replan_steps=config.control.replan_steps,
                max_episode_steps=config.episode.max_steps,
                feedback_deadline_s=config.control.feedback_deadline_s,
                batch_window_s=config.control.batch_window_s,
                use_reuse=config.use_reuse,
                text_format=config.text_format,  # type: ignore[arg-type]
                fresh_episodes=config.reset.on_start,
                resets=config.reset.mode != "none",
            ),
            clock=time.monotonic,
        )
        shapes = ShapeGuard()
        # Image conversions (decoding, resizing) run here as messages arrive, off the control tick.
        self._converter_pool = (
            ThreadPoolExecutor(max_workers=_CONVERTER_THREADS, thread_name_prefix="plugrl-convert")
            if config.images
            else None
        )
        self.envs = [
            EnvIO(self, i, ns, config, shapes, self._group, self._on_input, time.monotonic, self._converter_pool)
            for i, ns in enumerate(config.envs)
        ]
        self._interrupted = [False] * len(self.envs)
        self._resetting = [False] * len(self.envs)

        self._steps = TimerSteps(len(self.envs), config.control.period_s)
        self._loop_rate = RateMeter()
        self._step_rates = [RateMeter() for _ in self.envs]
        self.transient_faults: deque[float] = deque()  # times of survived rclpy faults (see spin_resiliently)
        self._last_close = ""
        self._reconnects = 0
        self._dead_man = DeadManSwitch(config.pause.max_age_s, time.monotonic) if config.pause.max_age_s > 0 else None
        self._paused_by_topic = self._dead_man is not None  # held until the switch first says run
        self._paused_by_service = config.pause.start_paused
        if config.pause.topic:
            # A latching pause must not lose a message; a dead-man switch wants only its latest
            # (a backlog of old "run" messages must not count as fresh), from any publisher.
            qos = qos_profile("reliable", 10) if self._dead_man is None else qos_profile("sensor_data", 1)
            self.create_subscription(Bool, config.pause.topic, self._on_pause_topic, qos, callback_group=self._group)
        self.create_service(SetBool, "~/set_paused", self._on_set_paused, callback_group=self._group)
        self.rollout.set_paused(self.paused)

        from diagnostic_msgs.msg import DiagnosticArray

        self._diagnostics = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._uplink_mark = (0, 0)  # (bytes sent, env steps) at the last diagnostics report
        period = config.control.period_s
        if self._lockstep:
            # housekeeping only (resets, deadlines, batching windows); steps are event-driven
            self.create_timer(min(period, 0.01), self._housekeeping, callback_group=self._group)
        else:
            self.create_timer(period, self._on_tick, callback_group=self._group)
        # Status runs on the steady clock: under use_sim_time a simulator that never
        # publishes /clock would otherwise leave /diagnostics and the log silent.
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self.create_timer(
            config.status.diagnostics_period_s, self._publish_diagnostics, callback_group=self._group, clock=steady
        )
        if config.status.log_period_s > 0:
            self.create_timer(config.status.log_period_s, self._log_status, callback_group=self._group, clock=steady)

        self.link = TrainerLink(self, config.trainer, self._on_link_event, self._group)
        self._describe_startup()
        self.link.start()

    # -- state ---------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused_by_topic or self._paused_by_service

    def _now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def _stamp(self) -> Any:
        return self.get_clock().now().to_msg()

    def _describe_startup(self) -> None:
        c = self.config
        envs = ", ".join(ns or "(no namespace)" for ns in c.envs)
        topics = ", ".join(self.envs[0].topics)
        self.get_logger().info(
            f"{len(c.envs)} env(s): {envs}; mode {c.control.mode}"
            + (f" at {c.control.rate_hz:g} Hz" if not self._lockstep else "")
            + f"; observing {topics}; trainer {c.trainer.uri}"
            + ("; starting paused" if self._paused_by_service else "")
            + (
                f"; dead-man switch on {c.pause.topic}: running only while it says false every "
                f"{c.pause.max_age_s:g} s or more often"
                if self._dead_man is not None
                else ""
            )
        )
        if self._lockstep and any(a.idle != "none" for a in c.actions):
            self.get_logger().info("lockstep mode publishes only chunk steps: idle behaviours are not used")

    # -- trainer events ------------------------------------------------------

    def _on_link_event(self, event: LinkEvent) -> None:
        log = self.get_logger()
        if isinstance(event, FrameReceived):
            result = self.rollout.on_frame(event.epoch, event.frame)
            if result.kind == "error":
                log.error(f"the trainer broke the protocol: {result.detail}; closing and reconnecting")
                self.link.abort(event.epoch, result.detail)
            elif result.kind == "metadata" and result.metadata is not None:
                shown = ", ".join(f"{k}={v}" for k, v in result.metadata.describe().items()) or "nothing announced"
                log.info(f"trainer metadata: {shown}")
                if result.metadata.ignored:
                    log.warning(f"ignoring malformed metadata keys: {', '.join(result.metadata.ignored)}")
                self._poll()
            elif result.kind == "action":
                log.debug(f"connection {event.epoch}: action, env(s) {list(result.envs)}, {len(event.frame)} bytes")
                if self._lockstep:
                    for env in result.envs:
                        self._step(env)
                else:
                    self._start_chunks(result.envs)
        elif isinstance(event, Connected):
            self.rollout.on_connected(event.epoch)
            log.info(f"connected to the trainer at {event.uri} (connection {event.epoch})")
        elif isinstance(event, Disconnected):
            lost = self.rollout.on_disconnected(event.epoch)
            self._last_close = f"{event.kind.value}: {event.detail}"
            dropped = f"; dropped the chunks of env(s) {list(lost)}" if lost else ""
            text = f"trainer connection closed ({event.kind.value}, {event.detail}){dropped}"
            # (rclpy refuses one call site logging at two severities)
            if event.kind in (CloseKind.STOP, CloseKind.CLIENT):
                log.info(text)
            else:
                log.warning(text)
            if event.kind in (CloseKind.RESYNC, CloseKind.LOST, CloseKind.ABORTED):
                self._reconnects += 1
        elif isinstance(event, ConnectFailed):
            log.warning(
                f"cannot reach the trainer at {self.config.trainer.uri}: {event.detail}; "
                f"retrying in {event.retry_in_s:.1f} s",
                throttle_duration_sec=15.0,
            )
        elif isinstance(event, Notice):
            log.warning(event.text)
        elif isinstance(event, Finished):
            self._on_finished(event)

    def _on_finished(self, event: Finished) -> None:
        log = self.get_logger()
        if event.kind is CloseKind.FATAL:
            log.error(f"stopping: {event.detail}")
            self.exit_code = EXIT_FATAL
        elif event.kind is CloseKind.STOP:
            log.info("the trainer finished the run (plugrl-server-stop); stopping")
        self.finished = True

    # -- stepping ------------------------------------------------------------

    def _on_tick(self) -> None:
        """Timer mode: sample the steps that are due, send what is due, publish this tick's steps."""
        self._check_dead_man()
        now_ns = self._now_ns()  # the node's clock: simulated time under use_sim_time
        now_s = now_ns * 1e-9
        self._loop_rate.add(now_s)
        steps = self._steps
        steps.tick()
        stale = [io.stale_sources(now_ns) for io in self.envs]
        for io in self.envs:
            if steps.due(io.index, now_s):
                self._evaluate(io, now_ns, bool(stale[io.index]))
            self._check_failure(io, stale[io.index])
        self._advance_resets()
        self._poll(now_ns)
        stamp = self._stamp()
        for io in self.envs:
            i = io.index
            action = None if self.paused or stale[i] else self.rollout.take_step(i)
            if action is not None:
                io.publish(action, stamp)
                steps.started(i, now_s)
            elif not (self.paused or stale[i]) and (
                steps.awaiting_answer(i) or (self.rollout.step_in_flight(i) and not steps.due(i, now_s))
            ):
                pass  # its next chunk's first step is on its way, or that step is still running: keep the command
            else:
                io.idle(stamp)

    def _start_chunks(self, envs: Sequence[int]) -> None:
        """Timer mode: a new chunk's first step goes out the moment the chunk arrives, not at the next tick."""
        self._check_dead_man()
        if self.paused:
            return
        now_ns = self._now_ns()
        stamp = self._stamp()
        for i in envs:
            io = self.envs[i]
            if io.stale_sources(now_ns):
                continue  # the next tick idles it
            action = self.rollout.take_step(i)
            if action is not None:
                io.publish(action, stamp)
                self._steps.started(i, now_ns * 1e-9)

    def _evaluate(self, io: EnvIO, now_ns: int, stale: bool) -> None:
        i = io.index
        if not self.rollout.step_in_flight(i) or not io.step_complete():
            return  # no step, or a once-per-step topic has not reported this step yet
        row = None if stale else io.observe(now_ns)
        if row is None:
            # The step's outcome cannot be observed: wait, and cut the chunk
            # once it can be (the rest of it was planned for an old state).
            self._interrupted[i] = True
            return
        reward, terminated, truncated, success = io.take_step_result()
        self.rollout.finish_step(i, reward, terminated, truncated, success, row, self._interrupted[i])
        self._interrupted[i] = False
        self._step_rates[i].add(now_ns * 1e-9)

    def _on_input(self, env: int) -> None:
        """A message arrived for ``env``. In lockstep it may complete the env's step."""
        if not self._lockstep:
            return
        self._check_dead_man()
        io = self.envs[env]
        if self.rollout.step_in_flight(env):
            if not io.step_complete():
                return
            self._evaluate(io, self._now_ns(), stale=False)
            self._advance_resets()
            self._poll()
            self._step(env)
        elif self.rollout.envs[env].idle and self.rollout.connected:
            self._poll()

    def _step(self, env: int) -> None:
        """Lockstep: publish ``env``'s next step at once."""
        self._check_dead_man()
        if self.paused:
            return
        action = self.rollout.take_step(env)
        if action is None:
            return
        self.envs[env].publish(action, self._stamp())

    def _housekeeping(self) -> None:
        """Lockstep: failures, resets, deadlines and batching windows, which no message arrival drives."""
        self._check_dead_man()
        self._loop_rate.add(self._now_ns() * 1e-9)
        for io in self.envs:
            self._check_failure(io, [])
        self._advance_resets()
        self._poll()

    def _check_failure(self, io: EnvIO, stale: list[str]) -> None:
        """An env whose step result is ``env_timeout_s`` overdue has failed: take it out of the batch."""
        timeout = self.config.control.env_timeout_s
        i = io.index
        if timeout <= 0 or not self.rollout.step_in_flight(i) or time.monotonic() - io.step_sent_s < timeout:
            return
        waiting = stale or io.step_waiting_for() or [io.problem or "its step result"]
        cause = f"env {i}: no step result for {timeout:g} s (waiting for {', '.join(waiting)})"
        if self.rollout.fail_env(i):
            self.get_logger().warning(f"{cause}; its episode is truncated at its last reported step")
            return
        # Not one step of the chunk reported: a feedback needs at least one,
        # so the chunk can only be dropped, and only with the connection.
        self.get_logger().warning(f"{cause} during the first step of a chunk; reopening the trainer connection")
        self.link.abort(self.rollout.epoch, cause, code=1000)

    def _advance_resets(self) -> None:
        for io in self.envs:
            i = io.index
            if not self.rollout.needs_reset(i):
                continue
            if not self._resetting[i]:
                if self.paused:
                    continue  # an operator paused the robots: do not move them
                io.require_fresh()
                io.reset.start()
                self._resetting[i] = True
            if io.reset.poll():
                self._resetting[i] = False
                self.rollout.reset_done(i)

    def _poll(self, now_ns: int | None = None) -> None:
        now_ns = self._now_ns() if now_ns is None else now_ns

        def capture(env: int) -> Any:
            io = self.envs[env]
            row = io.observe(now_ns)
            if row is not None:
                io.begin_window()
            return row

        inferring = [e.inferring for e in self.rollout.envs]
        for outgoing in self.rollout.poll(capture):
            self.link.send(self.rollout.epoch, outgoing)
            envs = list(outgoing.env_indices)
            self.get_logger().debug(f"connection {self.rollout.epoch}: {outgoing.kind}, env(s) {envs}")
        for env, before in zip(self.rollout.envs, inferring):
            if env.inferring and not before:
                self._steps.asked(env.index)
        if self.rollout.reopen_reason is not None:
            self.get_logger().warning(f"{self.rollout.reopen_reason}; reopening the trainer connection")
            self.link.abort(self.rollout.epoch, self.rollout.reopen_reason, code=1000)
            self.rollout.reopen_reason = None
        if self._lockstep:
            # a chunk may have just started for an env whose action arrived
            # while its previous step result was being processed
            for io in self.envs:
                if not self.rollout.step_in_flight(io.index):
                    self._step(io.index)

    # -- pause ---------------------------------------------------------------

    def _on_pause_topic(self, msg: Bool) -> None:
        if self._dead_man is not None:
            self._dead_man_changed(self._dead_man.heard(pause=msg.data))
        elif msg.data != self._paused_by_topic:
            self._paused_by_topic = msg.data
            self._apply_pause(f"pause topic {self.config.pause.topic}")

    def _check_dead_man(self) -> None:
        """A dead-man switch silent for longer than ``pause.max_age_s`` pauses the robots."""
        if self._dead_man is not None:
            self._dead_man_changed(self._dead_man.expired())

    def _dead_man_changed(self, change: str | None) -> None:
        if change is not None and self._dead_man is not None:
            self._paused_by_topic = self._dead_man.holding
            self._apply_pause(f"the dead-man switch on {self.config.pause.topic} ({change})")

    def _on_set_paused(self, request: SetBool.Request, response: SetBool.Response) -> SetBool.Response:
        self._paused_by_service = request.data
        self._apply_pause("~/set_paused")
        response.success = True
        response.message = "paused" if self.paused else "running"
        return response

    def _apply_pause(self, source: str) -> None:
        if self.paused == self.rollout.paused:
            return
        self.rollout.set_paused(self.paused)
        if self.paused:
            self.get_logger().warning(f"paused by {source}: actuators idle, running episodes are truncated")
            stamp = self._stamp()
            for io in self.envs:
                io.idle(stamp)
        else:
            self.get_logger().info(f"resumed by {source}")

    # -- status --------------------------------------------------------------

    def _waiting_for_clock(self) -> bool:
        """use_sim_time is on and no /clock message has come yet: simulated time has not started."""
        clock = self.get_clock()
        return bool(getattr(clock, "ros_time_is_active", False)) and clock.now().nanoseconds == 0

    def _step_rates_hz(self, now_ns: int) -> list[float]:
        """Each env's achieved env steps per second (of the node's clock) over the last few seconds."""
        return [meter.rate(now_ns * 1e-9) for meter in self._step_rates]

    def _env_state(self, io: EnvIO, now_ns: int) -> tuple[bytes, str]:
        i = io.index
        env = self.rollout.envs[i]
        stale = io.stale_sources(now_ns)
        if self._resetting[i]:
            if io.reset.failures:
                return WARN, f"reset failing ({io.reset.failures}x): {io.reset.last_error}"
            return OK, f"resetting ({io.reset.state.value})"
        if stale:
            if all(reason.endswith("(nothing new since the reset)") for reason in stale):
                return OK, "waiting for fresh observations after the reset"
            return WARN, "stale: " + "; ".join(stale)
        if io.problem:
            return WARN, io.problem
        if self.paused:
            return OK, "paused"
        if env.chunk is not None:
            waited = time.monotonic() - io.step_sent_s
            if env.step_in_flight and waited > max(1.0, 0.5 * self.config.control.env_timeout_s):
                waiting = ", ".join(io.step_waiting_for()) or "its step result"
                return WARN, f"step result overdue ({waited:.1f} s): waiting for {waiting}"
            return OK, "running"
        if env.pending is not None:
            return OK, "chunk done, feedback queued"
        return OK, "waiting for the trainer" if self.rollout.connected else "waiting for the trainer connection"

    def _bytes_per_step(self, bytes_sent: int) -> str:
        """Uplink bytes per env step since the last report: with the step rate, whether the link is the limit."""
        steps = sum(env.steps_total for env in self.rollout.envs)
        last_bytes, last_steps = self._uplink_mark
        self._uplink_mark = (bytes_sent, steps)
        if steps == last_steps:
            return "-"
        return f"{(bytes_sent - last_bytes) / (steps - last_steps):,.0f}"

    def _publish_diagnostics(self) -> None:
        now_ns = self._now_ns()
        rollout = self.rollout
        client = self.link.client
        prefix = self.get_fully_qualified_name().lstrip("/") or NODE_NAME
        trainer = Entry(f"{prefix}: trainer")
        trainer.values = {
            "uri": self.config.trainer.uri,
            "connected": str(rollout.connected),
            "connections": str(rollout.connections),
            "reconnects": str(self._reconnects),
            "last close": self._last_close or "-",
            "infer round trip median ms": percentile_ms(list(rollout.infer_latencies), 0.5),
            "infer round trip p95 ms": percentile_ms(list(rollout.infer_latencies), 0.95),
            "actions received": str(rollout.actions_received),
            "feedbacks sent": str(rollout.feedbacks_sent),
            "bytes sent": str(client.bytes_sent),
            "bytes received": str(client.bytes_received),
            "bytes sent per env step": self._bytes_per_step(client.bytes_sent),
        }
        if rollout.metadata is not None:
            trainer.values.update({f"trainer {k}": v for k, v in rollout.metadata.describe().items()})
        if not rollout.connected:
            trainer.worse(ERROR if rollout.connections == 0 else WARN, "not connected")
        control = Entry(f"{prefix}: control")
        loop_rate = self._loop_rate.rate(now_ns * 1e-9)
        step_rates = self._step_rates_hz(now_ns)
        control.values = {
            "mode": self.config.control.mode,
            "target rate Hz": "-" if self._lockstep else f"{self.config.control.rate_hz:g}",
            "env step rate Hz": f"{sum(step_rates) / len(step_rates):.1f}",  # per env, averaged over the envs
            "loop rate Hz": f"{loop_rate:.1f}",
            "paused": str(self.paused),
        }
        waiting_for_clock = self._waiting_for_clock()
        if waiting_for_clock:
            control.worse(WARN, "waiting for /clock (use_sim_time is true and no clock message has come)")
        elif self.paused:
            control.worse(WARN, "paused")
        elif not self._lockstep and loop_rate and loop_rate < 0.9 * self.config.control.rate_hz:
            control.worse(WARN, f"control loop at {loop_rate:.1f} Hz, below {self.config.control.rate_hz:g} Hz")
        entries = [trainer, control]
        for io in self.envs:
            env = rollout.envs[io.index]
            entry = Entry(f"{prefix}: env {io.index} ({io.namespace or 'no namespace'})")
            level, message = self._env_state(io, now_ns)
            entry.worse(level, message) if level != OK else None
            entry.message = message
            entry.values = {
                "step rate Hz": f"{step_rates[io.index]:.1f}",
                "episodes": str(env.episodes),
                "last return": "-" if env.last_return is None else f"{env.last_return:.3f}",
                "steps": str(env.steps_total),
                "chunks lost": str(env.chunks_lost),
                "reset failures": str(io.reset.total_failures),
                "non-finite actions": str(io.nonfinite_actions),
            }
            entries.append(entry)
        self._diagnostics.publish(status_array(entries, prefix, self._stamp()))

    def _log_status(self) -> None:
        rollout = self.rollout
        envs = rollout.envs
        episodes = sum(e.episodes for e in envs)
        returns = [e.last_return for e in envs if e.last_return is not None]
        if self._waiting_for_clock():
            self.get_logger().warning(
                "waiting for /clock: use_sim_time is true and no clock message has come, so the control loop "
                "has not started (start the simulator, or set use_sim_time:=false)"
            )
            return
        now_ns = self._now_ns()
        stale = [io.index for io in self.envs if io.stale_sources(now_ns)]
        link = f"connected (connection {rollout.connections})" if rollout.connected else "NOT connected"
        rates = self._step_rates_hz(now_ns)
        shown = " ".join(f"{r:.1f}" for r in rates) if len(rates) <= 8 else f"{min(rates):.1f}..{max(rates):.1f}"
        rate = f" | env steps/s {shown}" + ("" if self._lockstep else f" (target {self.config.control.rate_hz:g})")
        ret = f", mean last return {sum(returns) / len(returns):.3f}" if returns else ""
        self.get_logger().info(
            f"trainer {link}{rate} | {sum(e.steps_total for e in envs)} steps, {episodes} episodes{ret} | "
            f"infer {percentile_ms(list(rollout.infer_latencies), 0.5)} ms"
            + (f" | stale envs {stale}" if stale else "")
            + (" | PAUSED" if self.paused else "")
        )

    # -- shutdown ------------------------------------------------------------

    def shutdown_gracefully(self) -> None:
        """Idle every actuator first, then close the trainer connection with 1000."""
        try:
            stamp = self._stamp()
            for io in self.envs:
                io.reset.cancel()
                io.idle(stamp)
            deadline = time.monotonic() + _IDLE_DELIVERY_S
            if not all([io.wait_delivered(deadline) for io in self.envs]):
                self.get_logger().warning(
                    f"an actuator did not acknowledge its idle command within {_IDLE_DELIVERY_S:g} s"
                )
        finally:
            if self._converter_pool is not None:
                self._converter_pool.shutdown(wait=False, cancel_futures=True)
            self.link.stop()
            self.link.join(self.config.trainer.close_timeout_s + 1.0)


# How long the shutdown waits for the robot to acknowledge the idle commands (reliable QoS).
_IDLE_DELIVERY_S = 1.0

# rclpy can fail to take one message (seen with the Jazzy wheels, "Unable to convert call
# argument", while a robot's publishers restart). Losing that message is better than
# stopping every robot; a fault that keeps coming is not transient and ends the bridge.
_TRANSIENT_FAULTS_ALLOWED = 20
_TRANSIENT_FAULT_WINDOW_S = 10.0


def spin_resiliently(executor: SingleThreadedExecutor, node: BridgeNode) -> None:
    """One executor turn; a transient rclpy fault is logged and survived, a persistent one re-raised."""
    try:
        executor.spin_once(timeout_sec=0.1)
    except RuntimeError as exc:
        now = time.monotonic()
        faults = node.transient_faults
        faults.append(now)
        while faults and faults[0] < now - _TRANSIENT_FAULT_WINDOW_S:
            faults.popleft()
        if len(faults) > _TRANSIENT_FAULTS_ALLOWED:
            raise
        node.get_logger().error(f"ROS failed to deliver a message ({exc}); it is lost, the bridge carries on")


# glibc's mallopt parameters
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Every camera message, observation batch and frame is a buffer of the same
# few sizes, allocated and freed tens of times a second. glibc serves blocks
# above its mmap threshold (128 KiB at first) with fresh mmaps and returns
# freed heap tops to the kernel, so each of them was page-faulted in again:
# 12,000-20,000 faults a second, milliseconds at a time under the GIL, which
# the control tick then waited for. Keep such blocks in the heap instead
# (32 MiB is glibc's largest threshold) and the freed memory with the process.
_MMAP_THRESHOLD_BYTES = 32 << 20
_TRIM_THRESHOLD_BYTES = 256 << 20


def tune_process() -> None:
    """Keep the allocator from handing the bridge's large buffers back to the kernel after every use."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return  # not glibc: its allocator needs no such help, or offers none
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)


def main(args: list[str] | None = None) -> int:
    """``ros2 run plugrl_ros bridge --ros-args --params-file bridge.yaml``."""
    from rclpy.signals import SignalHandlerOptions

    # SIGINT/SIGTERM only ask for a stop (see stop_request): the loop below ends, the actuators
    # are idled while the ROS context is still valid, then the trainer connection is closed.
    stop_request.install()
    tune_process()
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except RuntimeError as exc:  # rcl refusing the command line: a user mistake, not a crash
        error = explain_refusal(str(exc))
        if error is not None:
            print(f"[plugrl_bridge] configuration error: {error}", file=sys.stderr)
        else:
            reason = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            print(f"[plugrl_bridge] cannot read the command line: {reason}", file=sys.stderr)
        return EXIT_CONFIG
    node: BridgeNode | None = None
    code = EXIT_OK
    try:
        if stop_request.requested():
            return EXIT_OK  # stopped while starting: no actuator has been touched
        node = BridgeNode(command_line=sys.argv if args is None else args)
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        # a stop is seen within one turn (0.1 s): the handler cannot wake rcl's wait, and needs not
        while not node.finished and not stop_request.requested():
            spin_resiliently(executor, node)
        if stop_request.requested() and not node.finished:
            node.get_logger().info("interrupted: idling the actuators and closing the trainer connection")
        code = node.exit_code
    except ConfigError as exc:
        print(f"[plugrl_bridge] configuration error: {exc}", file=sys.stderr)
        code = EXIT_CONFIG
    finally:
        if node is not None:
            node.shutdown_gracefully()
            node.destroy_node()
        rclpy.try_shutdown()
    return code
