"""The ROS floor of lockstep throughput: a robot stepped by a bare rclpy node, with no trainer at all.

Run: ``python bench/ros_lockstep_client.py --envs N [--robot probe|gym]``.

Per env it does what the bridge's lockstep does on the ROS side and nothing
else: publish an action, wait until every topic of a step has arrived
(probe robot: ``t``, ``a``, ``reward``, ``terminated``; ``plugrl-gym-robot``:
``truncated``, ``observation``, ``reward``, ``terminated``), publish the next
one; after a terminal step, call the ``reset`` service and wait for the fresh
observation. No observations are converted, no trainer is asked. Its env steps
per second are the most any rclpy client of the robot can reach on this
machine: what the bridge's lockstep throughput is bounded by. It prints one
JSON line of cumulative counters every 0.25 s and runs until interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

from rclpy.node import Node
from std_msgs.msg import Bool, Float32, Float64, Float64MultiArray
from std_srvs.srv import Trigger

from plugrl_ros.node.process import make_executor
from plugrl_ros.ros.qos import qos_profile
from plugrl_ros.ros.spin import init_ros, spin_until_shutdown


@dataclass(frozen=True)
class Robot:
    """What a step of one robot kind is, on its topics."""

    namespace: str
    step_topics: tuple[str, ...]
    reset_topics: tuple[str, ...]
    types: dict[str, type]
    terminal_topics: tuple[str, ...]
    action_dim: int
    reset_first: bool  # whether the robot starts with its episode over (it refuses actions before a reset)


ROBOTS = {
    "probe": Robot(
        "probe", ("t", "a", "reward", "terminated"), ("t", "a"),
        {"t": Float64, "a": Float64MultiArray, "reward": Float32, "terminated": Bool}, ("terminated",), 2, False,
    ),
    # Pendulum-v1 (one action, truncated at 200 steps), as bench_gym.py runs it
    "gym": Robot(
        "gym", ("truncated", "observation", "reward", "terminated"), ("observation",),
        {"truncated": Bool, "observation": Float64MultiArray, "reward": Float64, "terminated": Bool},
        ("terminated", "truncated"), 1, True,
    ),
}  # fmt: skip


class LockstepClient(Node):
    def __init__(self, n: int, robot: Robot) -> None:
        super().__init__("plugrl_bench_ros_lockstep")
        qos = qos_profile("reliable", 100)
        self.steps = 0
        self._robot = robot
        self._action = Float64MultiArray(data=[0.5] * robot.action_dim)
        self._heard: list[set[str]] = [set() for _ in range(n)]
        self._waiting: list[tuple[str, ...]] = [()] * n
        self._terminal = [False] * n
        self._action_publishers = []
        self._resets = []
        for env in range(n):
            ns = f"{robot.namespace}{env}"
            self._action_publishers.append(self.create_publisher(Float64MultiArray, f"{ns}/action", qos))
            self._resets.append(self.create_client(Trigger, f"{ns}/reset"))
            for topic in robot.step_topics:
                self.create_subscription(robot.types[topic], f"{ns}/{topic}", self._on_message(env, topic), qos)
        self.create_timer(0.25, self._report)
        self._started = False
        self.create_timer(0.5, self._start)

    def _start(self) -> None:
        if self._started or not all(p.get_subscription_count() for p in self._action_publishers):
            return
        self._started = True
        for env in range(len(self._action_publishers)):
            if self._robot.reset_first:
                self._reset(env)
            else:
                self._step(env)

    def _step(self, env: int) -> None:
        self._heard[env].clear()
        self._waiting[env] = self._robot.step_topics
        self._action_publishers[env].publish(self._action)

    def _on_message(self, env: int, topic: str):
        def callback(msg: object) -> None:
            if topic in self._robot.terminal_topics and msg.data:  # type: ignore[attr-defined]
                self._terminal[env] = True
            heard = self._heard[env]
            heard.add(topic)
            if not self._waiting[env] or not all(t in heard for t in self._waiting[env]):
                return
            if self._waiting[env] is self._robot.step_topics:
                self.steps += 1
                if self._terminal[env]:
                    self._reset(env)
                    return
            self._step(env)

        return callback

    def _reset(self, env: int) -> None:
        self._terminal[env] = False
        self._waiting[env] = ()
        self._heard[env].clear()
        future = self._resets[env].call_async(Trigger.Request())
        future.add_done_callback(lambda _: self._after_reset(env))

    def _after_reset(self, env: int) -> None:
        # the reset's fresh t and a may already be here
        self._waiting[env] = self._robot.reset_topics
        if all(t in self._heard[env] for t in self._robot.reset_topics):
            self._step(env)

    def _report(self) -> None:
        print(json.dumps({"t": time.monotonic(), "steps": self.steps}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=1)
    parser.add_argument("--robot", choices=sorted(ROBOTS), default="probe", help="the robot it steps")
    parser.add_argument("--executor", choices=("single", "events"), default="single", help="rclpy executor")
    args = parser.parse_args()
    init_ros(None)
    node = LockstepClient(args.envs, ROBOTS[args.robot])
    return spin_until_shutdown(node, make_executor(args.executor))


if __name__ == "__main__":
    sys.exit(main())
