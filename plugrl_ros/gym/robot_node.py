"""``plugrl-gym-robot``: N copies of any Gymnasium env as one ROS 2 node, each a robot under its own namespace.

Copy i lives under namespace ``gym<i>``. It publishes its observation on
``observation`` (std_msgs/Float64MultiArray, flattened float64; a Dict
observation on ``observation/<key>``, one topic per key), ``reward``
(std_msgs/Float64), ``terminated`` and ``truncated`` (std_msgs/Bool) and,
with ``--camera WxH``, ``camera/image_raw`` (sensor_msgs/Image, rgb8, the
env's ``rgb_array`` rendering); it takes its action on ``action``
(std_msgs/Float64MultiArray; the conversions are :mod:`plugrl_ros.gym.spaces`'),
and its ``reset`` service (std_srvs/Trigger) starts the next episode with
that episode's seed (:func:`plugrl_ros.gym.copies.episode_seed`). An action
of the wrong width, or with a NaN or infinite value, is refused with a
warning naming its topic and never reaches the env; so is one for a copy
whose episode is over and not yet reset. ``--print-config`` prints the
bridge's params file for these copies instead of running them.

Two behaviours, as ``--mode``:

* ``lockstep`` (a simulator): every action message is exactly one
  ``env.step``, after which ``truncated``, the observation, the picture,
  ``reward`` and ``terminated`` are published once, in that order (the bridge
  ends a lockstep step on the others, so ``truncated`` goes first). Nothing
  is published on a timer, so nothing can pass for the result of a step that
  did not happen. ``/clock`` (rosgraph_msgs/Clock) carries simulated time:
  the env's ``dt`` times the steps taken by the copy that has taken most, so
  nodes with ``use_sim_time`` follow the simulation.
* ``timer`` (like a real robot's driver): every copy steps at ``--rate`` Hz
  with its latest action (the action ``0`` — clipped into the action
  space — once actions stop for a while, as a driver's watchdog would) and
  publishes its topics every cycle; an episode's end is published once and
  the copy then holds still until it is reset.
"""

from __future__ import annotations

import argparse
import array
import math
import sys
import time
from collections.abc import Callable

import numpy as np
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.time import Time
from rosgraph_msgs.msg import Clock as ClockMessage
from sensor_msgs.msg import Image
from std_msgs.msg import Bool, Float64, Float64MultiArray, MultiArrayDimension
from std_srvs.srv import Trigger

from plugrl_ros.gym.copies import CAMERA, Camera, EnvUnavailable, GymCopy, check_camera
from plugrl_ros.gym.spaces import ACTION, UnsupportedSpace, namespace
from plugrl_ros.ros.qos import qos_profile
from plugrl_ros.ros.spin import init_ros, spin_until_shutdown
from plugrl_ros.ros_args import without_ros_args

MODES = ("lockstep", "timer")
# Timer mode: a driver that hears no action for this long stops using the last one.
ACTION_TIMEOUT_S = 0.5
CLOCK_REPEAT_S = 0.1
WARNING_PERIOD_S = 5.0


class _Robot:
    """One copy with its publishers and its latest action."""

    def __init__(self, node: Node, copy: GymCopy) -> None:
        ns = namespace(copy.index)
        qos = qos_profile("reliable", 10)
        self.ns = ns
        self.copy = copy
        self.states = [
            (
                key,
                node.create_publisher(Float64MultiArray, f"{ns}/{key.topic}", qos),
                [MultiArrayDimension(label=key.name, size=key.size, stride=key.size)],
            )
            for key in copy.keys
        ]
        self.image = node.create_publisher(Image, f"{ns}/{CAMERA}/image_raw", qos) if copy.camera else None
        self.reward = node.create_publisher(Float64, f"{ns}/reward", qos)
        self.terminated = node.create_publisher(Bool, f"{ns}/terminated", qos)
        self.truncated = node.create_publisher(Bool, f"{ns}/truncated", qos)
        # timer mode: the action to step with, when it came (node clock), and whether the end was published
        self.idle_action = copy.action.clip(np.zeros(copy.action.width))
        self.action = self.idle_action
        self.action_ns = 0
        self.reported_end = False
        self.warned_s: dict[str, float] = {}  # reason -> when an action refused for it was last reported


class GymRobot(Node):
    """The copies behind ROS topics, stepped per action (lockstep) or by a timer (timer)."""

    def __init__(self, env_id: str, n_copies: int, mode: str, rate_hz: float, seed: int, camera: Camera | None) -> None:
        super().__init__("plugrl_gym_robot")
        assert mode in MODES, mode
        self.mode = mode
        self.robots = [_Robot(self, GymCopy(env_id, i, seed, camera)) for i in range(n_copies)]
        qos = qos_profile("reliable", 10)
        for robot in self.robots:
            self.create_subscription(Float64MultiArray, f"{robot.ns}/{ACTION}", self._on_action(robot), qos)
            self.create_service(Trigger, f"{robot.ns}/reset", self._on_reset(robot))
        self._dt_ns = round(float(getattr(self.robots[0].copy.env.unwrapped, "dt", 1.0 / rate_hz)) * 1e9)
        self._clock_publisher = self.create_publisher(ClockMessage, "/clock", qos) if mode == "lockstep" else None
        self._clock_steps = 0  # lockstep: the most steps any copy has taken
        if mode == "timer":
            for robot in self.robots:
                robot.copy.reset()  # a driver's robot is somewhere from the start; the bridge's reset is the next
            self.create_timer(1.0 / rate_hz, self._on_cycle)
        else:
            # In lockstep the observation is published only in answer to an action or a reset: any
            # other message could pass for a step's result. The bridge gets its first observation by
            # resetting every copy when it starts (reset.on_start). Simulated time starts one step in
            # (a clock at 0 reads as "no clock yet" to a node with use_sim_time) and is repeated on a
            # wall-clock timer while no step moves it, so that a node started later hears it too.
            steady = Clock(clock_type=ClockType.STEADY_TIME)
            self.create_timer(CLOCK_REPEAT_S, self._publish_clock, clock=steady)
        self.get_logger().info(
            f"{n_copies} cop{'y' if n_copies == 1 else 'ies'} of {env_id} under "
            f"{namespace(0)}..{namespace(n_copies - 1)}; mode {mode}"
            + (f" at {rate_hz:g} Hz" if mode == "timer" else f", {self._dt_ns * 1e-9:g} s of simulated time per step")
            + (f"; camera {camera.width}x{camera.height}" if camera else "")
            + f"; seed {seed}"
        )

    # -- publishing ----------------------------------------------------------

    def _now(self) -> Time:
        """Simulated time in lockstep (what /clock says), the node's clock in timer mode."""
        if self._clock_publisher is not None:
            return Time(nanoseconds=(self._clock_steps + 1) * self._dt_ns)
        return self.get_clock().now()

    def _publish_observation(self, robot: _Robot) -> None:
        copy = robot.copy
        for key, publisher, dims in robot.states:
            msg = Float64MultiArray(data=array.array("d", key.values(copy.observation).tobytes()))
            msg.layout.dim = dims
            publisher.publish(msg)
        if robot.image is not None:
            picture = copy.picture()
            image = Image(height=picture.shape[0], width=picture.shape[1], encoding="rgb8", step=picture.shape[1] * 3)
            image.header.stamp = self._now().to_msg()
            image.header.frame_id = f"{robot.ns}/{CAMERA}"
            image.data = array.array("B", picture.tobytes())
            robot.image.publish(image)

    def _publish_clock(self) -> None:
        assert self._clock_publisher is not None
        self._clock_publisher.publish(ClockMessage(clock=self._now().to_msg()))

    # -- callbacks -----------------------------------------------------------

    def _on_action(self, robot: _Robot) -> Callable[[Float64MultiArray], None]:
        topic = f"{robot.ns}/{ACTION}"
        layout = robot.copy.action

        def callback(msg: Float64MultiArray) -> None:
            values = np.asarray(msg.data, dtype=np.float64)[msg.layout.data_offset :]
            problem = layout.problem(values)
            if problem is not None:
                self._refuse(robot, problem, f"{topic}: action refused, {problem} (got {values.tolist()[:8]}); no step")
                return
            if self.mode == "timer":
                robot.action = values
                robot.action_ns = self.get_clock().now().nanoseconds
                return
            if robot.copy.over:
                over = f"the episode is over (call {robot.ns}/reset)"
                self._refuse(robot, over, f"{topic}: action refused, {over}; no step")
                return
            self._step(robot, values)

        return callback

    def _refuse(self, robot: _Robot, reason: str, text: str) -> None:
        """Warn of a refused action, at most once per :data:`WARNING_PERIOD_S` per copy and reason (rclpy's
        throttle is per call site: one copy's warnings would hide every other's, and a wrong width the
        NaN that follows it)."""
        now_s = time.monotonic()
        if now_s - robot.warned_s.get(reason, -math.inf) >= WARNING_PERIOD_S:
            robot.warned_s[reason] = now_s
            self.get_logger().warning(text)

    def _step(self, robot: _Robot, values: np.ndarray) -> None:
        """Lockstep: one env step and its results."""
        result = robot.copy.step(values)
        if robot.copy.steps_total > self._clock_steps:
            self._clock_steps = robot.copy.steps_total
            self._publish_clock()
        robot.truncated.publish(Bool(data=result.truncated))  # first: the bridge's step ends on the others
        self._publish_observation(robot)
        robot.reward.publish(Float64(data=result.reward))
        robot.terminated.publish(Bool(data=result.terminated))

    def _on_cycle(self) -> None:
        """Timer mode: one step of every copy whose episode runs, with its latest action; then its topics."""
        now_ns = self.get_clock().now().nanoseconds
        for robot in self.robots:
            if (now_ns - robot.action_ns) * 1e-9 > ACTION_TIMEOUT_S:
                robot.action = robot.idle_action
            reward, terminated, truncated = 0.0, False, False
            if not robot.copy.over:
                result = robot.copy.step(robot.action)
                reward, terminated, truncated = result.reward, result.terminated, result.truncated
            # The end of an episode is an event: published once, so that a repeat still in
            # flight cannot end the next episode at its start.
            robot.truncated.publish(Bool(data=truncated and not robot.reported_end))
            self._publish_observation(robot)
            robot.reward.publish(Float64(data=reward))
            robot.terminated.publish(Bool(data=terminated and not robot.reported_end))
            robot.reported_end = robot.reported_end or terminated or truncated

    def _on_reset(self, robot: _Robot) -> Callable[[Trigger.Request, Trigger.Response], Trigger.Response]:
        def callback(request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
            del request
            seed = robot.copy.reset()
            robot.action = robot.idle_action
            robot.reported_end = False
            self._publish_observation(robot)
            response.success = True
            response.message = f"{robot.ns}: episode {robot.copy.episodes - 1}, seed {seed}"
            return response

        return callback

    def destroy_node(self) -> None:
        for robot in self.robots:
            robot.copy.close()
        super().destroy_node()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plugrl-gym-robot", description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="a Gymnasium env id, e.g. Pendulum-v1 or InvertedPendulum-v5")
    parser.add_argument("--copies", type=int, default=1, help="copies of the env (namespaces gym0, gym1, ...)")
    parser.add_argument("--mode", choices=MODES, default="lockstep", help="step per action, or run on a timer")
    parser.add_argument("--rate", type=float, default=50.0, help="timer mode: steps per second (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every episode's reset (default %(default)s)")
    parser.add_argument("--camera", type=Camera.parse, default=None, metavar="WxH", help="publish rendered pictures")
    parser.add_argument(
        "--print-config", action="store_true", help="print the bridge's params file for these copies and exit"
    )
    return parser


def main(args: list[str] | None = None) -> int:
    argv = without_ros_args(sys.argv if args is None else args)[1:]
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.copies < 1:
        parser.error("--copies must be at least 1")
    if not options.rate > 0:
        parser.error("--rate must be positive")
    if not 0 <= options.seed < 2**63:
        parser.error("--seed must be a non-negative integer")
    try:
        if options.print_config:
            from plugrl_ros.gym.bridge_config import bridge_config_yaml

            sys.stdout.write(
                bridge_config_yaml(options.env, options.copies, options.mode, options.rate, options.camera)
            )
            return 0
        if options.camera is not None:
            check_camera(options.env, options.camera)
        init_ros(args)
        node = GymRobot(options.env, options.copies, options.mode, options.rate, options.seed, options.camera)
    except (EnvUnavailable, UnsupportedSpace) as exc:
        parser.exit(2, f"plugrl-gym-robot: {exc}\n")
    return spin_until_shutdown(node)


if __name__ == "__main__":
    sys.exit(main())
