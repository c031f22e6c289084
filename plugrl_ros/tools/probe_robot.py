"""``plugrl-probe-robot``: N probe envs as a real ROS robot, for checking a whole bridge deployment.

Env i lives under namespace ``probe<i>``: it listens for actions on
``action`` (std_msgs/Float64MultiArray), and after each one publishes ``t``
(std_msgs/Float64), ``a`` (std_msgs/Float64MultiArray), ``reward``
(std_msgs/Float32) and ``terminated`` (std_msgs/Bool); the service ``reset``
(std_srvs/Trigger) starts a new episode. Its episodes last ``3 + 2*(i % 3)``
steps, as in docs/protocol.md, so a conformance trainer can check from the
feedback alone that the bridge summed rewards, kept terminal observations
and executed chunks in order. ``config/probe.yaml`` is the bridge's config
for it.
"""

from __future__ import annotations

import argparse
import sys

from rclpy.node import Node
from std_msgs.msg import Bool, Float32, Float64, Float64MultiArray
from std_srvs.srv import Trigger

from plugrl_ros.ros.qos import qos_profile
from plugrl_ros.ros.spin import init_ros, spin_until_shutdown
from plugrl_ros.ros_args import without_ros_args
from plugrl_ros.tools.probe_env import ProbeEnvs


def namespace(env: int) -> str:
    return f"probe{env}"


class ProbeRobot(Node):
    """The probe envs behind ROS topics; every action message is exactly one step."""

    def __init__(self, n_envs: int, action_dim: int, episode_steps: int = 0) -> None:
        super().__init__("plugrl_probe_robot")
        self.envs = ProbeEnvs(n_envs, action_dim, episode_steps)
        qos = qos_profile("reliable", 100)
        self._pubs = []
        for i in range(n_envs):
            ns = namespace(i)
            pubs = (
                self.create_publisher(Float64, f"{ns}/t", qos),
                self.create_publisher(Float64MultiArray, f"{ns}/a", qos),
                self.create_publisher(Float32, f"{ns}/reward", qos),
                self.create_publisher(Bool, f"{ns}/terminated", qos),
            )
            self._pubs.append(pubs)
            self.create_subscription(Float64MultiArray, f"{ns}/action", self._on_action(i), qos)
            self.create_service(Trigger, f"{ns}/reset", self._on_reset(i))
        # The state is published only in answer to an action or a reset: in
        # lockstep any other message (a greeting for a new subscriber, a timer)
        # could pass for a step's result. A bridge gets its first observation
        # by resetting every env when it starts (reset.on_start).

    def _publish_state(self, env: int) -> None:
        t_pub, a_pub, _, _ = self._pubs[env]
        t_pub.publish(Float64(data=float(self.envs.t[env])))
        a_pub.publish(Float64MultiArray(data=self.envs.a[env].tolist()))

    def _on_action(self, env: int):
        def callback(msg: Float64MultiArray) -> None:
            values = list(msg.data)
            if len(values) != self.envs.action_dim:
                self.get_logger().error(
                    f"{namespace(env)}: action of {len(values)} values, expected {self.envs.action_dim}; ignored"
                )
                return
            reward, terminated = self.envs.step(env, values)
            self._publish_state(env)
            _, _, reward_pub, done_pub = self._pubs[env]
            reward_pub.publish(Float32(data=reward))
            done_pub.publish(Bool(data=terminated))

        return callback

    def _on_reset(self, env: int):
        def callback(request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
            self.envs.reset(env)
            self._publish_state(env)
            response.success = True
            return response

        return callback


def main(args: list[str] | None = None) -> int:
    argv = without_ros_args(sys.argv if args is None else args)[1:]
    parser = argparse.ArgumentParser(prog="plugrl-probe-robot", description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=1, help="number of probe envs (namespaces probe0, probe1, ...)")
    parser.add_argument("--action-dim", type=int, default=2, help="action width per step (default %(default)s)")
    parser.add_argument(
        "--episode-steps",
        type=int,
        default=0,
        help="every episode this long instead of the probe's 3, 5, 7 (benchmarks; not probe-conformant)",
    )
    options = parser.parse_args(argv)
    if options.episode_steps < 0:
        parser.error("--episode-steps must not be negative")
    init_ros(args)
    node = ProbeRobot(options.envs, options.action_dim, options.episode_steps)
    return spin_until_shutdown(node)


if __name__ == "__main__":
    sys.exit(main())
