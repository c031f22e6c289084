"""``plugrl-demo-robot``: N simulated two-link reachers as one real ROS 2 node, the demo's robot.

Reacher i lives under namespace ``reacher<i>``. It publishes ``joint_states``
(sensor_msgs/JointState: position and velocity of ``shoulder`` and
``elbow``), ``camera/image_raw`` (sensor_msgs/Image, rgb8), ``target``
(std_msgs/Float64MultiArray: the target relative to the arm, see
:meth:`Reacher.target_state`), ``reward`` (std_msgs/Float32),
``terminated`` and ``success`` (std_msgs/Bool: reaching the target ends
the episode, so both say the same); it takes joint velocity commands (rad/s) on
``command`` (std_msgs/Float64MultiArray) and starts a new episode when its
``reset`` service (std_srvs/Trigger) is called. ``config/demo.yaml`` is the
bridge's config for it.

Two behaviours, as ``--mode``:

* ``lockstep`` (a simulator): every command message advances the physics by
  exactly one step, after which the state, picture, reward and terminated
  flag are published once. Nothing is published on a timer, so nothing can
  pass for the result of a step that did not happen.
* ``timer`` (like a real robot's driver): the physics runs at ``--rate`` Hz
  with the latest command (zero once commands stop for a while, as a
  driver's watchdog would), and every cycle publishes the sensors.
"""

from __future__ import annotations

import argparse
import array
import sys
from collections.abc import Callable

import numpy as np
from rclpy.node import Node
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Bool, Float32, Float64MultiArray, MultiArrayDimension
from std_srvs.srv import Trigger

from plugrl_ros import opencv
from plugrl_ros.demo.reacher import JOINT_NAMES, Reacher, ReacherSpec
from plugrl_ros.ros.qos import qos_profile
from plugrl_ros.ros.spin import init_ros, spin_until_shutdown
from plugrl_ros.ros_args import without_ros_args

MODES = ("lockstep", "timer")
# Timer mode: a driver that hears no command for this long stops the arm
# rather than running on with a command from a controller that may be gone.
COMMAND_TIMEOUT_S = 0.5


def namespace(env: int) -> str:
    return f"reacher{env}"


class _Arm:
    """One reacher with its publishers and the latest command."""

    def __init__(self, node: Node, index: int, reacher: Reacher, image_size: int) -> None:
        ns = namespace(index)
        qos = qos_profile("reliable", 10)
        self.ns = ns
        self.reacher = reacher
        self.image_size = image_size
        self.joint_states = node.create_publisher(JointState, f"{ns}/joint_states", qos)
        self.image = node.create_publisher(Image, f"{ns}/camera/image_raw", qos)
        self.target = node.create_publisher(Float64MultiArray, f"{ns}/target", qos)
        self.reward = node.create_publisher(Float32, f"{ns}/reward", qos)
        self.terminated = node.create_publisher(Bool, f"{ns}/terminated", qos)
        self.success = node.create_publisher(Bool, f"{ns}/success", qos)
        self.command = np.zeros(2)
        self.command_ns = 0  # when the latest command arrived (node clock)
        self.reported_end = False  # timer mode: the termination of this episode was published


class DemoRobot(Node):
    """The reachers behind ROS topics, stepped per command (lockstep) or by a timer (timer)."""

    def __init__(self, n_envs: int, mode: str, rate_hz: float, seed: int, image_size: int) -> None:
        super().__init__("plugrl_demo_robot")
        assert mode in MODES, mode
        self.mode = mode
        spec = ReacherSpec()
        self._dt = spec.dt if mode == "lockstep" else 1.0 / rate_hz
        self.arms = [_Arm(self, i, Reacher(spec, np.random.default_rng([seed, i])), image_size) for i in range(n_envs)]
        qos = qos_profile("reliable", 10)
        for i, arm in enumerate(self.arms):
            self.create_subscription(Float64MultiArray, f"{arm.ns}/command", self._on_command(i), qos)
            self.create_service(Trigger, f"{arm.ns}/reset", self._on_reset(i))
        if mode == "timer":
            self.create_timer(self._dt, self._on_cycle)
        # In lockstep the state is published only in answer to a command or a reset:
        # any other message (a greeting for a new subscriber, a timer) could pass for
        # a step's result. The bridge gets its first observation by resetting every
        # reacher when it starts (reset.on_start).
        self.get_logger().info(
            f"{n_envs} reacher(s) under {namespace(0)}..{namespace(n_envs - 1)}; mode {mode}"
            + (f" at {rate_hz:g} Hz" if mode == "timer" else f", {self._dt:g} s per step")
        )

    # -- publishing ----------------------------------------------------------

    def _publish_state(self, arm: _Arm) -> None:
        stamp = self.get_clock().now().to_msg()
        reacher = arm.reacher
        joints = JointState(name=list(JOINT_NAMES), position=reacher.q.tolist(), velocity=reacher.qd.tolist())
        joints.header.stamp = stamp
        joints.header.frame_id = f"{arm.ns}/base_link"
        arm.joint_states.publish(joints)

        picture = reacher.render(arm.image_size)
        image = Image(height=picture.shape[0], width=picture.shape[1], encoding="rgb8", step=picture.shape[1] * 3)
        image.header.stamp = stamp
        image.header.frame_id = f"{arm.ns}/camera"
        image.data = array.array("B", picture.tobytes())
        arm.image.publish(image)

        target = Float64MultiArray(data=reacher.target_state().tolist())
        target.layout.dim = [MultiArrayDimension(label="dx dy dshoulder delbow", size=4, stride=4)]
        arm.target.publish(target)

    def _publish_result(self, arm: _Arm, reward: float, terminated: bool) -> None:
        arm.reward.publish(Float32(data=reward))
        arm.terminated.publish(Bool(data=terminated))

    # -- callbacks -----------------------------------------------------------

    def _on_command(self, env: int) -> Callable[[Float64MultiArray], None]:
        arm = self.arms[env]

        def callback(msg: Float64MultiArray) -> None:
            values = np.asarray(msg.data, dtype=np.float64)[msg.layout.data_offset :]
            if values.shape != (2,) or not np.isfinite(values).all():
                self.get_logger().error(
                    f"{arm.ns}/command: expected 2 finite joint velocities, got {values.tolist()[:8]}; ignored",
                    throttle_duration_sec=5.0,
                )
                return
            arm.command = values
            arm.command_ns = self.get_clock().now().nanoseconds
            if self.mode == "lockstep":
                reward, terminated = arm.reacher.step(values, self._dt)
                arm.success.publish(Bool(data=terminated))  # first: it belongs to the step the others complete
                self._publish_state(arm)
                self._publish_result(arm, reward, terminated)

        return callback

    def _on_cycle(self) -> None:
        """Timer mode: one physics step of every arm with its latest command, then its sensors."""
        now_ns = self.get_clock().now().nanoseconds
        for arm in self.arms:
            if (now_ns - arm.command_ns) * 1e-9 > COMMAND_TIMEOUT_S:
                arm.command = np.zeros(2)
            reward, terminated = arm.reacher.step(arm.command, self._dt)
            # The end of an episode is an event: reported once, so that a
            # repeat still in flight cannot end the next episode at its start.
            report = terminated and not arm.reported_end
            arm.reported_end = arm.reported_end or terminated
            arm.success.publish(Bool(data=report))
            self._publish_state(arm)
            self._publish_result(arm, reward, report)

    def _on_reset(self, env: int) -> Callable[[Trigger.Request, Trigger.Response], Trigger.Response]:
        arm = self.arms[env]

        def callback(request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
            arm.reacher.reset()
            arm.command = np.zeros(2)
            arm.reported_end = False
            self._publish_state(arm)
            response.success = True
            response.message = f"{arm.ns}: new episode"
            return response

        return callback


def main(args: list[str] | None = None) -> int:
    argv = without_ros_args(sys.argv if args is None else args)[1:]
    parser = argparse.ArgumentParser(prog="plugrl-demo-robot", description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=2, help="number of reachers (namespaces reacher0, reacher1, ...)")
    parser.add_argument("--mode", choices=MODES, default="lockstep", help="step per command, or run on a timer")
    parser.add_argument("--rate", type=float, default=20.0, help="timer mode: physics and sensor rate in Hz")
    parser.add_argument("--seed", type=int, default=0, help="seed of the start and target poses")
    parser.add_argument("--image-size", type=int, default=64, help="camera pictures are this many pixels square")
    options = parser.parse_args(argv)
    if options.envs < 1:
        parser.error("--envs must be at least 1")
    if not options.rate > 0:
        parser.error("--rate must be positive")
    if options.image_size < 16:
        parser.error("--image-size must be at least 16")
    problem = opencv.missing()
    if problem is not None:
        parser.exit(2, f"plugrl-demo-robot: the camera pictures are drawn with OpenCV ({problem}); {opencv.INSTALL}\n")
    init_ros(args)
    node = DemoRobot(options.envs, options.mode, options.rate, options.seed, options.image_size)
    return spin_until_shutdown(node)


if __name__ == "__main__":
    sys.exit(main())
