"""The robot side every mode drives: each env's I/O, its reset, and whether the robots may move.

A mode (the PlugRL rollout of train mode; the policy runner of deploy mode)
owns only its link and its stepping rule. Through this interface it asks an
env for a fresh observation, opens the env's reward window when a chunk
starts from that observation, collects a step's result, publishes a step or
the sinks' idle behaviour, and drives resets. Pause and the dead-man switch
live here too: a pause idles every actuator, whatever the mode, and the mode
hears of it through ``on_pause``.

All of it runs on the node's one single-threaded executor: no locks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from rclpy.node import Node

from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.robot.env_io import EnvIO, ShapeGuard
from plugrl_ros.robot.intervention import PersonInput
from plugrl_ros.robot.pause import Pause
from plugrl_ros.robot.silence import Verdict
from plugrl_ros.robot.takeover import Control
from plugrl_ros.ros.config import BridgeConfig

# Threads that convert images beside the executor (OpenCV releases the GIL): a small robot computer's cores.
_CONVERTER_THREADS = 2
WAITING_FOR_CLOCK = (
    "waiting for /clock: use_sim_time is true and no clock message has come, so the control loop "
    "has not started (start the simulator, or set use_sim_time:=false)"
)

# How long the shutdown waits for the robot to acknowledge the idle commands (reliable QoS).
# The data goes out at once, but Fast DDS (the default RMW) acknowledges a sample only in answer
# to the writer's heartbeat, sent every 3 s: between processes the ack takes 0-3 s (measured
# 1.2-2.7 s). Under `ros2 launch` this stays within the 5 s before it escalates to SIGTERM.
_IDLE_DELIVERY_S = 3.5


class RobotSide:
    """``len(config.envs)`` robots on ROS topics, with their pause; ``envs[i]`` is env ``i``'s I/O and state."""

    def __init__(
        self,
        node: Node,
        config: BridgeConfig,
        callback_group: object,
        on_input: Callable[[int], None],
        on_pause: Callable[[bool], None],
    ) -> None:
        """``on_input(env)``: a message arrived for ``env``; ``on_pause(paused)``: the robots were paused/resumed."""
        self._node = node
        self._on_pause = on_pause
        shapes = ShapeGuard()
        # Image conversions (decoding, resizing) run here as messages arrive, off the control tick.
        self._converter_pool = (
            ThreadPoolExecutor(max_workers=_CONVERTER_THREADS, thread_name_prefix="plugrl-convert")
            if config.images
            else None
        )
        self.envs = [
            EnvIO(node, i, ns, config, shapes, callback_group, on_input, time.monotonic, self._converter_pool)
            for i, ns in enumerate(config.envs)
        ]
        self.pause = Pause(node, config.pause, callback_group, self._pause_changed)
        self._applied_pause = self.pause.paused
        person = config.intervention
        # a person in the loop, per env: their device's topics resolve in the env's namespace
        self.people = (
            None
            if person is None
            else [
                PersonInput(node, i, ns, person, config.actions, callback_group, time.monotonic)
                for i, ns in enumerate(config.envs)
            ]
        )

    # -- pause ---------------------------------------------------------------

    @property
    def paused(self) -> bool:
        """An operator (topic, service) or the dead-man switch holds the robots: no mode may move them."""
        return self.pause.paused

    def check_pause(self) -> None:
        """Call on every control tick and event: a silent dead-man switch pauses the robots."""
        self.pause.check()

    def _pause_changed(self, source: str) -> None:
        paused = self.pause.paused
        if paused == self._applied_pause:
            return
        self._applied_pause = paused
        self._on_pause(paused)
        log = self._node.get_logger()
        if paused:
            log.warning(f"paused by {source}: actuators idle, running episodes are truncated")
            self.idle_all()
        else:
            log.info(f"resumed by {source}")

    # -- a person in the loop --------------------------------------------------

    def control(self, env: int) -> Control:
        """Who commands ``env`` now: the policy (always, without an intervention section), a person, or nobody."""
        return Control.POLICY if self.people is None else self.people[env].control()

    def person_command(self, env: int) -> np.ndarray | None:
        """The person's latest command for ``env``, an action row (None: none)."""
        return None if self.people is None else self.people[env].command()

    def executed(self, env: int, base: np.ndarray, sent: dict[str, np.ndarray | None]) -> np.ndarray:
        """The action ``env`` executed when its actuators were ``sent`` this (see :meth:`EnvIO.executed`)."""
        return self.envs[env].executed(base, sent)

    # -- observing -----------------------------------------------------------

    def now_ns(self) -> int:
        """The node's clock (simulated time under use_sim_time)."""
        return self._node.get_clock().now().nanoseconds

    def waiting_for_clock(self) -> bool:
        """use_sim_time is on and no /clock message has come yet: simulated time has not started."""
        clock = self._node.get_clock()
        return bool(getattr(clock, "ros_time_is_active", False)) and clock.now().nanoseconds == 0

    def stamp(self) -> Any:
        return self._node.get_clock().now().to_msg()

    def observe(self, env: int, now_ns: int, starting: bool = False) -> ObservationRow | None:
        """``env``'s fresh observation, or None (see :meth:`EnvIO.observe`). ``starting``: a chunk would
        start from it, which also needs every actuator to have a subscriber."""
        return self.envs[env].observe(now_ns, starting)

    def begin_window(self, env: int) -> None:
        """A chunk starts from the observation just taken: ``env``'s rewards and done flags count from now."""
        self.envs[env].begin_window()

    def step_result(self, env: int) -> tuple[float, bool, bool, bool]:
        """(reward, terminated, truncated, success) of ``env`` since its last step result or window start."""
        return self.envs[env].take_step_result()

    # -- acting --------------------------------------------------------------

    def publish(self, env: int, action: np.ndarray, stamp: Any) -> dict[str, np.ndarray | None]:
        """One step of ``action`` on ``env``'s actuators (shaped; a non-finite slice idles that actuator);
        what each actuator was sent, by its config key (None: nothing)."""
        return self.envs[env].publish(action, stamp)

    def idle(self, env: int, stamp: Any) -> dict[str, np.ndarray | None]:
        """``env``'s actuators do their configured idle behaviour (not in lockstep); what each was sent."""
        return self.envs[env].idle(stamp)

    def idle_all(self) -> None:
        stamp = self.stamp()
        for io in self.envs:
            io.idle(stamp)

    def reset(self, env: int) -> bool:
        """Drive ``env``'s reset (started on the first call, never while paused); True once it has completed.

        From its start on, ``env`` observes only messages newer than that moment.
        """
        io = self.envs[env]
        if not io.resetting:
            if self.paused:
                return False  # an operator paused the robots: do not move them
            self._start_reset(io)
        return self._poll_reset(io)

    def _start_reset(self, io: EnvIO) -> None:
        io.require_fresh()
        io.reset.start()
        io.resetting = True

    def _poll_reset(self, io: EnvIO) -> bool:
        if not io.reset.poll():
            return False
        io.resetting = False
        io.recovering = False
        io.silence.restart(time.monotonic())  # the robot's answer to this reset is now due
        return True

    def tend(self) -> None:
        """Call on every control tick (or lockstep housekeeping): find silent envs, report and recover them.

        An env with no fresh observation for its limit is reported at WARN, naming its silent topics,
        and, if it has not moved since its last reset, reset again (with the reset's backoff): one lost
        message must not take a robot out of training. See :mod:`plugrl_ros.robot.silence`.
        """
        now_s = time.monotonic()
        now_ns = self.now_ns()
        paused = self.paused
        log = self._node.get_logger()
        for io in self.envs:
            if io.recovering and io.resetting:
                self._poll_reset(io)
            silent = [] if io.resetting else io.stale_sources(now_ns)  # (a reset running is reported as such)
            movable = not (io.moved or io.resetting or paused)
            verdict = io.silence.check(now_s, silent, io.silence_limit_s(), movable)
            where = f"env {io.index} ({io.namespace or 'no namespace'})"
            if verdict is Verdict.WARN:
                if io.silence.retry_at_s is not None:
                    then = f"resetting it in {io.silence.retry_at_s - now_s:.1f} s"
                elif io.silence.can_reset:
                    then = "it has moved since its reset, so it is not reset again"
                else:
                    then = "no reset is configured (reset.mode none) to make it publish again"
                log.warning(
                    f"{where}: no fresh observation for {io.silence.silent_for(now_s):.1f} s, waiting for "
                    f"{', '.join(silent)}; {then}"
                )
            elif verdict is Verdict.RESET:
                log.warning(
                    f"{where}: resetting it for its silence (attempt {io.silence.resets}): its robot may have "
                    f"published before the bridge's subscription matched, or not at all"
                )
                self._start_reset(io)
                io.recovering = True
            elif verdict is Verdict.HEARD:
                log.info(f"{where}: observing again")

    def shutdown(self) -> None:
        """Idle every actuator and stop every reset; the converter threads end."""
        try:
            stamp = self.stamp()
            for io in self.envs:
                io.reset.cancel()
                io.idle(stamp)
            deadline = time.monotonic() + _IDLE_DELIVERY_S
            if not all([io.wait_delivered(deadline) for io in self.envs]):
                self._node.get_logger().warning(
                    f"an actuator did not acknowledge its idle command within {_IDLE_DELIVERY_S:g} s"
                )
        finally:
            if self._converter_pool is not None:
                self._converter_pool.shutdown(wait=False, cancel_futures=True)
