"""Train mode: the robot side driven by the PlugRL rollout core, over one trainer link.

The mode owns the link, the rollout core (:mod:`plugrl_ros.rollout`) and the
stepping rule (docs/design.md): in ``timer`` mode a wall-clock (or sim-clock)
timer publishes one action step per env per tick and samples each step's
result at a later tick; a new chunk's first step goes out as soon as it
arrives (the rule is :mod:`plugrl_ros.rollout.timer_steps`). In ``lockstep``
mode the next step is published as soon as every source of the env has
produced a message newer than the last action. Everything else about the
robots is the robot side's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from rclpy.clock import Clock, ClockType
from rclpy.logging import LoggingSeverity
from rclpy.node import Node

from plugrl_ros.protocol.client import CloseKind, Connected, ConnectFailed, Disconnected, FrameReceived, Notice
from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.robot.env_io import EnvIO
from plugrl_ros.robot.robot_side import RobotSide
from plugrl_ros.robot.status import Entry
from plugrl_ros.robot.takeover import Control
from plugrl_ros.rollout.rollout import Rollout, RolloutSettings
from plugrl_ros.rollout.timer_steps import TimerSteps
from plugrl_ros.ros.config import BridgeConfig
from plugrl_ros.thread_guard import Crash, log_crash
from plugrl_ros.train.observer import TransitionObserver
from plugrl_ros.train.rates import RateMeter
from plugrl_ros.train.status import UplinkMeter, train_diagnostics, train_status_line
from plugrl_ros.train.trainer_link import Finished, LinkEvent, TrainerLink

EXIT_OK = 0
EXIT_FATAL = 1


def rollout_settings(config: BridgeConfig) -> RolloutSettings:
    """What the rollout core needs to know, from the bridge's configuration."""
    return RolloutSettings(
        n_envs=len(config.envs),
        min_action_width=config.action_width_needed,
        # an actuator without a slice applies every value a wider action brings
        refuse_wider=not config.takes_whole_action,
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
        interventions=config.intervention is not None,
    )


class TrainMode:
    """PlugRL stepping of ``robot`` for a trainer; :attr:`finished` once the run is over."""

    def __init__(
        self,
        node: Node,
        config: BridgeConfig,
        robot: RobotSide,
        callback_group: object,
        observer: TransitionObserver | None = None,
        on_crash: Callable[[Crash], None] = log_crash,
    ) -> None:
        """``observer`` (the recorder, when recording) hears every transition; it never steers.
        ``on_crash``: told if the link thread dies of an error nobody expected (see :mod:`plugrl_ros.thread_guard`)."""
        self._node = node
        self.observer = observer
        self.config = config
        self.robot = robot
        self.lockstep = config.control.mode == "lockstep"
        self.finished = False
        self.exit_code = EXIT_OK
        self.rollout = Rollout(rollout_settings(config), clock=time.monotonic)
        self.rollout.set_paused(robot.paused)
        self._steps = TimerSteps(len(robot.envs), config.control.period_s)
        # the last command an env's actuators got was a person's: never kept once the policy may act again
        self._last_by_person = [False] * len(robot.envs)
        self.loop_rate = RateMeter()  # control ticks, on the node's clock
        self.step_rates = [RateMeter() for _ in robot.envs]  # each env's finished steps, on the node's clock
        self.last_close = ""
        self.reconnects = 0
        # why the trainer does not fit this bridge's configuration, while it does not (empty: it does)
        self.config_problem = ""
        self._closing_for_config: int | None = None  # the epoch aborted for it
        self._uplink = UplinkMeter()
        period = config.control.period_s
        if self.lockstep:
            # housekeeping only (resets, deadlines, batching windows); steps are event-driven. On the steady
            # clock: under use_sim_time a simulator whose /clock moves only when it steps would otherwise
            # never see its first reset called, nor its first step.
            steady = Clock(clock_type=ClockType.STEADY_TIME)
            node.create_timer(min(period, 0.01), self._housekeeping, callback_group=callback_group, clock=steady)
        else:
            node.create_timer(period, self._on_tick, callback_group=callback_group)
        self.link = TrainerLink(node, config.trainer, self._on_link_event, callback_group, on_crash)
        # (per message, only when asked for: the line would be built on every chunk otherwise)
        self._debug = node.get_logger().is_enabled_for(LoggingSeverity.DEBUG)

    def start(self) -> None:
        self.link.start()

    def stop(self) -> None:
        """Close the trainer connection with 1000 (after the robot side idled the actuators)."""
        self.link.stop()
        self.link.join(self.config.trainer.close_timeout_s + 1.0)
        # The executor no longer spins: the close is handled here, so the recording and the log end with it.
        # Frames are dropped: the actuators are idle for good.
        for event in self.link.undelivered():
            if isinstance(event, Connected | Disconnected):
                self._on_link_event(event)

    def on_pause(self, paused: bool) -> None:
        """The robot side paused or resumed the robots: running episodes are truncated."""
        self.rollout.set_paused(paused)

    def describe(self) -> str:
        return f"trainer {self.config.trainer.uri}"

    def diagnostics(self, prefix: str) -> list[Entry]:
        return train_diagnostics(prefix, self, self._uplink)

    def status_line(self) -> str:
        return train_status_line(self)

    # -- trainer events ------------------------------------------------------

    def _on_link_event(self, event: LinkEvent) -> None:
        log = self._node.get_logger()
        if isinstance(event, FrameReceived):
            result = self.rollout.on_frame(event.epoch, event.frame)
            if result.kind == "error":
                log.error(f"the trainer broke the protocol: {result.detail}; closing and reconnecting")
                self.link.abort(event.epoch, result.detail)
            elif result.kind == "mismatch":
                self._mismatch(event.epoch, result.detail or "")
            elif result.kind == "metadata" and result.metadata is not None:
                if self.observer is not None:
                    self.observer.link_event(
                        self.robot.now_ns(), "metadata", event.epoch, detail={"metadata": result.metadata.describe()}
                    )
                shown = ", ".join(f"{k}={v}" for k, v in result.metadata.describe().items()) or "nothing announced"
                log.info(f"trainer metadata: {shown}")
                if result.metadata.ignored:
                    log.warning(f"ignoring malformed metadata keys: {', '.join(result.metadata.ignored)}")
                self._poll()
            elif result.kind == "action":
                if self.config_problem:
                    log.info("the trainer's actions fit the configuration now")
                    self.config_problem = ""
                if self._debug:
                    log.debug(f"connection {event.epoch}: action, env(s) {list(result.envs)}, {len(event.frame)} bytes")
                if self.observer is not None:
                    self._observe_chunks(result.envs)
                if self.lockstep:
                    for env in result.envs:
                        self._step(env)
                else:
                    self._start_chunks(result.envs)
        elif isinstance(event, Connected):
            self.rollout.on_connected(event.epoch)
            if self.observer is not None:
                self.observer.link_event(self.robot.now_ns(), "connect", event.epoch, detail={"uri": event.uri})
            log.info(f"connected to the trainer at {event.uri} (connection {event.epoch})")
        elif isinstance(event, Disconnected):
            begun = [env.episode_length > 0 or env.step_in_flight for env in self.rollout.envs]
            # an env that only awaited an answer lost its request, not a chunk or a feedback
            asking = [env.index for env in self.rollout.envs if env.inferring and not env.holds_action]
            lost = self.rollout.on_disconnected(event.epoch)
            if self.observer is not None:
                # the envs whose episode the close ended: the next connection starts them anew
                restarted = [
                    env.index
                    for env, was in zip(self.rollout.envs, begun, strict=True)
                    if was and (env.episode_length == 0 or env.restart_after_step)
                ]
                unanswered = [env for env in lost if env in asking]
                detail = {"unanswered_envs": unanswered} if unanswered else {}
                if restarted:
                    detail["restarted_envs"] = restarted
                self.observer.link_event(
                    self.robot.now_ns(),
                    "close",
                    event.epoch,
                    reason=f"{event.kind.value}: {event.detail}",
                    dropped_envs=lost,
                    detail=detail,
                )
            self.last_close = f"{event.kind.value}: {event.detail}"
            dropped = f"; dropped the chunks of env(s) {list(lost)}" if lost else ""
            text = f"trainer connection closed ({event.kind.value}, {event.detail}){dropped}"
            # (rclpy refuses one call site logging at two severities)
            if event.kind in (CloseKind.STOP, CloseKind.CLIENT) or event.epoch == self._closing_for_config:
                log.info(text)
            else:
                log.warning(text)
            if event.kind in (CloseKind.RESYNC, CloseKind.LOST, CloseKind.ABORTED):
                self.reconnects += 1
        elif isinstance(event, ConnectFailed):
            log.warning(
                f"cannot reach the trainer at {self.config.trainer.uri}: {event.detail}; "
                f"retrying in {event.retry_in_s:.1f} s",
                throttle_duration_sec=15.0,
            )
        elif isinstance(event, Notice):
            log.warning(event.text)
        elif isinstance(event, Finished):
            if event.kind is CloseKind.FATAL:
                log.error(f"stopping: {event.detail}")
                self.exit_code = EXIT_FATAL
            elif event.kind is CloseKind.STOP:
                log.info("the trainer finished the run (plugrl-server-stop); stopping")
            self.finished = True

    def _mismatch(self, epoch: int, detail: str) -> None:
        """The trainer's action space does not fit the configured actions: a configuration problem.

        Every reconnect to that trainer meets it again, so it is said once at ERROR (and stays on
        /diagnostics as ERROR), and the bridge reconnects only every ``trainer.reconnect_max_s``
        (the trainer may be restarted with the right settings, or another run begin).
        """
        if detail != self.config_problem:
            self._node.get_logger().error(
                f"the trainer's action does not fit this bridge's configuration: {detail}. Every reconnect "
                "will meet this again: start the trainer for this robot, or change the actions' slices "
                f"(control.action_dim, control.action_horizon); retrying every "
                f"{self.config.trainer.reconnect_max_s:g} s (trainer.reconnect_max_s)"
            )
        self.config_problem = detail
        self._closing_for_config = epoch
        self.link.abort(epoch, detail, slowly=True)

    # -- stepping ------------------------------------------------------------

    def _on_tick(self) -> None:
        """Timer mode: sample the steps that are due, send what is due, publish this tick's steps."""
        robot = self.robot
        robot.check_pause()
        robot.tend()
        now_ns = robot.now_ns()  # the node's clock: simulated time under use_sim_time
        now_s = now_ns * 1e-9
        self.loop_rate.add(now_s)
        steps = self._steps
        steps.tick()
        stale = [io.stale_sources(now_ns) for io in robot.envs]
        for io in robot.envs:
            if steps.due(io.index, now_s):
                self._evaluate(io, now_ns, bool(stale[io.index]))
            self._check_failure(io)
        self._advance_resets()
        self._poll(now_ns)
        stamp = robot.stamp()
        paused = robot.paused
        for io in robot.envs:
            i = io.index
            if not (paused or stale[i]) and self._replaced(i):
                self._replace_step(i, now_ns, now_s, stamp)
                continue
            action = None if paused or stale[i] else self.rollout.take_step(i)
            if action is not None:
                self._last_by_person[i] = False
                self._observe_step(i, now_ns, robot.publish(i, action, stamp))
                steps.started(i, now_s)
            elif not (paused or stale[i] or self._last_by_person[i]) and (
                steps.awaiting_answer(i) or (self.rollout.step_in_flight(i) and not steps.due(i, now_s))
            ):
                pass  # its next chunk's first step is on its way, or that step is still running: keep the command
            else:
                self._last_by_person[i] = False
                sent = robot.idle(i, stamp)
                if self.observer is not None:
                    self.observer.step(i, now_ns, None, sent, None, self._intervention(False, False))

    def _replaced(self, env: int) -> bool:
        """A person commands ``env``, or its device went silent while held, or the person let go and no chunk
        computed since has arrived: the policy's chunk must not run."""
        return self.robot.people is not None and (
            self.robot.control(env) is not Control.POLICY or not self.rollout.policy_may_act(env)
        )

    def _replace_step(self, env: int, now_ns: int, now_s: float, stamp: Any) -> None:
        """Timer mode, the policy's chunk replaced: the person's command goes out (through the same shaping and
        limits), else the idle behaviour. A chunk step due now runs it and is fed back with what it executed; a
        chunk the policy may no longer run ends after it."""
        robot, rollout = self.robot, self.rollout
        command = robot.person_command(env) if robot.control(env) is Control.PERSON else None
        if command is not None and rollout.step_in_flight(env) and not self._steps.due(env, now_s):
            return  # the person's step is still running: keep its command
        action = rollout.take_step(env)
        if command is not None:
            sent = robot.publish(env, command, stamp)
            rollout.person_moved(env)
        else:
            sent = robot.idle(env, stamp)
            rollout.cut(env)
        person = command is not None
        self._last_by_person[env] = person
        intervention = self._intervention(person, True, command)
        if action is None:
            if self.observer is not None:
                self.observer.step(env, now_ns, None, sent, None, intervention)
            return
        rollout.replaced(env, robot.executed(env, action, sent), person=person)
        self._steps.started(env, now_s)
        self._observe_step(env, now_ns, sent, intervention)

    def _intervention(
        self, person: bool, replaced: bool, command: np.ndarray | None = None
    ) -> tuple[bool, bool, np.ndarray | None] | None:
        """What the recorder hears of a step with a person in the loop (None without one)."""
        return None if self.robot.people is None else (person, replaced, command)

    def _start_chunks(self, envs: Sequence[int]) -> None:
        """Timer mode: a new chunk's first step goes out the moment the chunk arrives, not at the next tick."""
        robot = self.robot
        robot.check_pause()
        if robot.paused:
            return
        now_ns = robot.now_ns()
        stamp = robot.stamp()
        for i in envs:
            if robot.envs[i].stale_sources(now_ns):
                continue  # the next tick idles it
            if self._replaced(i):
                self._replace_step(i, now_ns, now_ns * 1e-9, stamp)
                continue
            self._last_by_person[i] = False
            action = self.rollout.take_step(i)
            if action is not None:
                self._observe_step(i, now_ns, robot.publish(i, action, stamp))
                self._steps.started(i, now_ns * 1e-9)

    def _evaluate(self, io: EnvIO, now_ns: int, stale: bool) -> None:
        i = io.index
        if not self.rollout.step_in_flight(i) or not io.step_complete():
            return  # no step, or a once-per-step topic has not reported this step yet
        row = None if stale else self.robot.observe(i, now_ns)
        if row is None:
            # The step's outcome cannot be observed: wait, and cut the chunk
            # once it can be (the rest of it was planned for an old state).
            io.interrupted = True
            return
        reward, terminated, truncated, success = self.robot.step_result(i)
        if self.observer is not None:
            self.observer.step_result(i, now_ns, reward, terminated, truncated, success)
        self.rollout.finish_step(i, reward, terminated, truncated, success, row, io.interrupted)
        io.interrupted = False
        self.step_rates[i].add(now_ns * 1e-9)

    def on_input(self, env: int) -> None:
        """A message arrived for ``env``. In lockstep it may complete the env's step."""
        if not self.lockstep:
            return
        self.robot.check_pause()
        io = self.robot.envs[env]
        if self.rollout.step_in_flight(env):
            if not io.step_complete():
                return
            now_ns = self.robot.now_ns()
            self._evaluate(io, now_ns, stale=False)
            self._advance_resets()
            self._poll(now_ns)
            self._step(env)
            return
        rollout_env = self.rollout.envs[env]
        if rollout_env.needs_reset:
            # its reset service may just have answered: polled now, not at the next housekeeping tick
            if not self.robot.reset(env):
                return
            self.rollout.reset_done(env)
            if any(e.needs_reset and self.robot.envs[e.index].resetting for e in self.rollout.envs):
                return  # another robot's answer is on its way: the last one sends them all in one infer
        if rollout_env.idle and self.rollout.connected:
            self._poll()

    def _step(self, env: int) -> None:
        """Lockstep: publish ``env``'s next step at once."""
        robot = self.robot
        robot.check_pause()
        if robot.paused:
            return
        action = self.rollout.take_step(env)
        if action is None:
            return
        sent = robot.publish(env, action, robot.stamp())
        if self.observer is not None:
            self._observe_step(env, robot.now_ns(), sent)

    # -- observing (the recorder hears every transition; it never steers) ------

    def _observe_step(
        self,
        env: int,
        now_ns: int,
        sent: dict[str, np.ndarray | None],
        intervention: tuple[bool, bool, np.ndarray | None] | None = None,
    ) -> None:
        """A chunk step went out (``intervention``: with a person in the loop, who commanded it; default: the
        policy)."""
        if self.observer is not None:
            if intervention is None:
                intervention = self._intervention(False, False)
            self.observer.step(env, now_ns, self.rollout.envs[env].next_step - 1, sent, None, intervention)

    def _observe_chunks(self, envs: Sequence[int]) -> None:
        assert self.observer is not None
        now_ns = self.robot.now_ns()
        latencies = self.rollout.infer_latencies
        if latencies:
            self.observer.latency(now_ns, latencies[-1])
        for env in envs:
            chunk = self.rollout.envs[env].chunk  # this env's steps of the chunk, [steps, width]
            if chunk is not None:
                self.observer.chunk(env, now_ns, chunk)

    def _observe_sent(
        self, now_ns: int, outgoing: Sequence[Any], rows: dict[int, ObservationRow], pending: list[Any]
    ) -> None:
        """The observations that went out in ``outgoing``, and the episodes its feedback ended."""
        observer = self.observer
        assert observer is not None
        for message in outgoing:
            for env in message.env_indices:
                if message.kind == "feedback":
                    fed = pending[env]
                    if fed is None or fed.row is None:
                        continue
                    observer.observation(env, now_ns, fed.row, "feedback")
                    if fed.episode is not None:
                        observer.episode_end(env, now_ns, fed.episode.ret, fed.episode.length, fed.episode.success)
                elif env in rows:  # absent: the infer reuses the feedback's row
                    observer.observation(env, now_ns, rows[env], "infer")

    def _housekeeping(self) -> None:
        """Lockstep: failures, resets, deadlines and batching windows, which no message arrival drives."""
        self.robot.check_pause()
        self.robot.tend()
        self.loop_rate.add(self.robot.now_ns() * 1e-9)
        for io in self.robot.envs:
            self._check_failure(io)
        self._advance_resets()
        self._poll()

    def _check_failure(self, io: EnvIO) -> None:
        """An env whose step result is ``env_timeout_s`` overdue has failed: take it out of the batch."""
        timeout = self.config.control.env_timeout_s
        i = io.index
        if timeout <= 0 or not self.rollout.step_in_flight(i) or time.monotonic() - io.step_sent_s < timeout:
            return
        # what keeps it, read now (in lockstep too: a step result may have come with a stale observation)
        stale = io.stale_sources(self.robot.now_ns())
        waiting = stale or io.step_waiting_for() or [io.conversion_problem or "its step result"]
        cause = f"env {i}: no step result for {timeout:g} s (waiting for {', '.join(waiting)})"
        log = self._node.get_logger()
        if self.rollout.fail_env(i):
            log.warning(f"{cause}; its episode is truncated at its last reported step")
            return
        # Not one step of the chunk reported: a feedback needs at least one,
        # so the chunk can only be dropped, and only with the connection.
        log.warning(f"{cause} during the first step of a chunk; reopening the trainer connection")
        self.link.abort(self.rollout.epoch, cause, code=1000)

    def _advance_resets(self) -> None:
        for io in self.robot.envs:
            if self.rollout.needs_reset(io.index) and self.robot.reset(io.index):
                self.rollout.reset_done(io.index)

    def _poll(self, now_ns: int | None = None) -> None:
        robot = self.robot
        now_ns = robot.now_ns() if now_ns is None else now_ns
        captured: dict[int, ObservationRow] = {}

        def capture(env: int) -> ObservationRow | None:
            row = robot.observe(env, now_ns, starting=True)
            if row is not None:
                captured[env] = row
            return row

        rollout_envs = self.rollout.envs
        # (per step in lockstep: only what is used is gathered)
        inferring = None if self.lockstep else [e.inferring for e in rollout_envs]
        pending = None if self.observer is None else [e.pending for e in rollout_envs]  # what a feedback carries
        outgoing = self.rollout.poll(capture)
        if pending is not None:
            self._observe_sent(now_ns, outgoing, captured, pending)
        # Each captured observation starts a chunk: its rewards and done flags count from it.
        # (No message is handled between the capture and here: one executor thread.)
        for env in captured:
            robot.begin_window(env)
        self.link.send(self.rollout.epoch, outgoing)
        if outgoing and self._debug:
            for message in outgoing:
                envs = list(message.env_indices)
                self._node.get_logger().debug(f"connection {self.rollout.epoch}: {message.kind}, env(s) {envs}")
        if inferring is not None:  # timer mode: a step is due when its chunk's answer is awaited
            for env, before in zip(rollout_envs, inferring):
                if env.inferring and not before:
                    self._steps.asked(env.index)
        if self.rollout.reopen_reason is not None:
            self._node.get_logger().warning(f"{self.rollout.reopen_reason}; reopening the trainer connection")
            self.link.abort(self.rollout.epoch, self.rollout.reopen_reason, code=1000)
            self.rollout.reopen_reason = None
        if self.lockstep:
            # a chunk may have just started for an env whose action arrived
            # while its previous step result was being processed
            for io in robot.envs:
                if not self.rollout.step_in_flight(io.index):
                    self._step(io.index)

    # -- status --------------------------------------------------------------

    def step_rates_hz(self, now_ns: int) -> list[float]:
        """Each env's achieved env steps per second (of the node's clock) over the last few seconds."""
        return [meter.rate(now_ns * 1e-9) for meter in self.step_rates]
