"""The bridge node: robots on ROS topics become PlugRL envs of one remote training run.

A composition only: parameters -> config (:mod:`plugrl_ros.ros.node_parameters`),
the robot side every mode drives (:class:`plugrl_ros.robot.robot_side.RobotSide`),
the mode with its link and stepping rule (train, deploy or teleop, behind the one interface of
:mod:`plugrl_ros.node.mode`), and the status it reports (:mod:`plugrl_ros.node.diagnostics`).
The process around it (signals, allocator, spin loop) is :mod:`plugrl_ros.node.process`.
All callbacks run on one single-threaded executor, so nothing needs locks.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.duration import Duration
from rclpy.node import Node

from plugrl_ros import __version__
from plugrl_ros.deploy.deploy_mode import DeployMode
from plugrl_ros.node.diagnostics import crash_entry, recording_entry, status_array
from plugrl_ros.node.mode import Mode
from plugrl_ros.record.recorder import Recorder
from plugrl_ros.robot.robot_side import WAITING_FOR_CLOCK, RobotSide
from plugrl_ros.ros.config import BridgeConfig, check_environment
from plugrl_ros.ros.node_parameters import configure
from plugrl_ros.teleop.teleop_mode import TeleopMode
from plugrl_ros.thread_guard import EXIT_CRASHED, Crash
from plugrl_ros.train.train_mode import TrainMode

NODE_NAME = "plugrl_bridge"
# config.mode -> the mode that drives the robots
MODES = {"train": TrainMode, "deploy": DeployMode, "teleop": TeleopMode}


class BridgeNode(Node):
    """One bridge: ``len(envs)`` robots sharing one trainer connection."""

    def __init__(self, command_line: Sequence[str] | None = None, **kwargs: Any) -> None:
        """``command_line``: what ``rclpy.init`` read (default ``sys.argv``), to name what rcl dropped."""
        super().__init__(NODE_NAME, **kwargs)
        self.config: BridgeConfig = configure(self, sys.argv if command_line is None else command_line)
        check_environment(self.config, os.environ)
        config = self.config
        group = MutuallyExclusiveCallbackGroup()
        # set by a thread that died of an error nobody expected (see thread_guard): ends the spin loop
        # once /diagnostics has said so (or two status periods later, should the executor be stuck too)
        self.crash: Crash | None = None
        self._crash_deadline = 0.0
        self._crash_published = False
        # The recorder's writer process starts before anything else runs (no threads forked with it);
        # a folder it cannot write is a startup error (RecordError), never a silent run without a record.
        self.recorder: Recorder | None = None
        if config.record.enabled:
            self.recorder = Recorder(config.record, on_error=self.get_logger().error, on_crash=self._on_crash)
            first = self.recorder.start()
            self.get_logger().info(f"recording every transition into {first}")
        self.transient_faults: deque[float] = deque()  # times of survived rclpy faults (see process.spin_resiliently)
        # (no message is delivered before the executor spins, so the mode exists when the robot side calls it)
        self.robot = RobotSide(self, config, group, self._on_input, self._on_pause)
        self.mode: Mode = MODES[config.mode](
            self, config, self.robot, group, observer=self.recorder, on_crash=self._on_crash
        )
        if self.recorder is not None:
            parameters = {name: parameter.value for name, parameter in sorted(self._parameters.items())}
            versions = {"plugrl_ros": __version__, "python": sys.version.split()[0]}
            self.recorder.config(self.robot.now_ns(), parameters, versions)

        self._diagnostics = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        # Status runs on the steady clock: under use_sim_time a simulator that never
        # publishes /clock would otherwise leave /diagnostics and the log silent.
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self.create_timer(
            config.status.diagnostics_period_s, self._publish_diagnostics, callback_group=group, clock=steady
        )
        if config.status.log_period_s > 0:
            self.create_timer(config.status.log_period_s, self._log_status, callback_group=group, clock=steady)
        self._describe_startup()
        self.mode.start()

    @property
    def finished(self) -> bool:
        if self.crash is not None:
            return self._crash_published or time.monotonic() > self._crash_deadline
        return self.mode.finished

    @property
    def exit_code(self) -> int:
        return EXIT_CRASHED if self.crash is not None else self.mode.exit_code

    def _on_crash(self, crash: Crash) -> None:
        """On the dying thread: say it at ERROR, and end the spin loop (the process exits non-zero)."""
        self.get_logger().error(crash.message())
        self._crash_deadline = time.monotonic() + 2 * self.config.status.diagnostics_period_s
        self.crash = crash

    def _on_input(self, env: int) -> None:
        self.mode.on_input(env)

    def _on_pause(self, paused: bool) -> None:
        self.mode.on_pause(paused)

    def _describe_startup(self) -> None:
        c = self.config
        lockstep = self.mode.lockstep
        envs = ", ".join(ns or "(no namespace)" for ns in c.envs)
        topics = ", ".join(self.robot.envs[0].topics)
        self.get_logger().info(
            f"{len(c.envs)} env(s): {envs}; mode {c.control.mode}"
            + (f" at {c.control.rate_hz:g} Hz" if not lockstep else "")
            + f"; observing {topics}; "
            + self.mode.describe()
            + ("; starting paused" if self.robot.pause.by_service else "")
            + (
                f"; dead-man switch on {c.pause.topic}: running only while it says false every "
                f"{c.pause.max_age_s:g} s or more often"
                if self.robot.pause.dead_man
                else ""
            )
        )
        if lockstep and any(a.idle != "none" for a in c.actions):
            self.get_logger().info("lockstep mode publishes only chunk steps: idle behaviours are not used")

    def _publish_diagnostics(self) -> None:
        self.publish_diagnostics()

    def publish_diagnostics(self) -> None:
        """The bridge's status on /diagnostics now (the timer's, and once more on the way out after a crash)."""
        prefix = self.get_fully_qualified_name().lstrip("/") or NODE_NAME
        entries = self.mode.diagnostics(prefix)
        crash = self.crash
        if crash is not None:
            entries.insert(0, crash_entry(prefix, crash))
        if self.recorder is not None:
            entries.append(recording_entry(prefix, self.recorder.status()))
        self._diagnostics.publish(status_array(entries, prefix, self.robot.stamp()))
        self._crash_published = crash is not None

    def flush_diagnostics(self, timeout_s: float = 1.0) -> None:
        """Wait (1 s at most) until every subscriber has the last status: an exiting process drops unsent ones."""
        self._diagnostics.wait_for_all_acked(Duration(seconds=timeout_s))

    def _log_status(self) -> None:
        if self.robot.waiting_for_clock():
            self.get_logger().warning(WAITING_FOR_CLOCK)
            return
        self.get_logger().info(self.mode.status_line())

    def shutdown_gracefully(self) -> None:
        """Idle every actuator first, then close the trainer (or policy) connections with 1000."""
        try:
            self.robot.shutdown()
        finally:
            try:
                self.mode.stop()
            finally:
                self.close_recording()

    def close_recording(self) -> None:
        """Finish the recording's file (after the actuators idled: their last commands are in it)."""
        if self.recorder is None:
            return
        status = self.recorder.close()
        files = ", ".join(str(path) for path in status.files)
        self.get_logger().info(
            f"recording {status.state.value}: {status.written} records written, {status.dropped} dropped; {files}"
        )
