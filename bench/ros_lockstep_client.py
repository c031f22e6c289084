"""The ROS floor of lockstep throughput: the probe robot stepped by a bare rclpy node, with no trainer at all.

Run: ``python bench/ros_lockstep_client.py --envs N``.

Per env it does what the bridge's lockstep does on the ROS side and nothing
else: publish an action, wait until ``t``, ``a``, ``reward`` and
``terminated`` have all arrived, publish the next one; after a terminal step,
call the ``reset`` service and wait for the fresh ``t`` and ``a``. No
observations are converted, no trainer is asked. Its env steps per second
are the most any rclpy client of the probe robot can reach on this machine:
what the bridge's lockstep throughput is bounded by. It prints one JSON line
of cumulative counters every 0.25 s and runs until interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rclpy.node import Node
from std_msgs.msg import Bool, Float32, Float64, Float64MultiArray
from std_srvs.srv import Trigger

from plugrl_ros.node.process import make_executor
from plugrl_ros.ros.qos import qos_profile
from plugrl_ros.ros.spin import init_ros, spin_until_shutdown

_STEP_TOPICS = ("t", "a", "reward", "terminated")
_RESET_TOPICS = ("t", "a")


class LockstepClient(Node):
    def __init__(self, n: int, action_dim: int) -> None:
        super().__init__("plugrl_bench_ros_lockstep")
        qos = qos_profile("reliable", 100)
        self.steps = 0
        self._action = Float64MultiArray(data=[0.5] * action_dim)
        self._heard: list[set[str]] = [set() for _ in range(n)]
        self._waiting: list[tuple[str, ...]] = [()] * n
        self._terminal = [False] * n
        self._action_publishers = []
        self._resets = []
        types = {"t": Float64, "a": Float64MultiArray, "reward": Float32, "terminated": Bool}
        for env in range(n):
            ns = f"probe{env}"
            self._action_publishers.append(self.create_publisher(Float64MultiArray, f"{ns}/action", qos))
            self._resets.append(self.create_client(Trigger, f"{ns}/reset"))
            for topic in _STEP_TOPICS:
                self.create_subscription(types[topic], f"{ns}/{topic}", self._on_message(env, topic), qos)
        self.create_timer(0.25, self._report)
        self._started = False
        self.create_timer(0.5, self._start)

    def _start(self) -> None:
        if self._started or not all(p.get_subscription_count() for p in self._action_publishers):
            return
        self._started = True
        for env in range(len(self._action_publishers)):
            self._step(env)

    def _step(self, env: int) -> None:
        self._heard[env].clear()
        self._waiting[env] = _STEP_TOPICS
        self._action_publishers[env].publish(self._action)

    def _on_message(self, env: int, topic: str):
        def callback(msg: object) -> None:
            if topic == "terminated" and msg.data:  # type: ignore[attr-defined]
                self._terminal[env] = True
            heard = self._heard[env]
            heard.add(topic)
            if not self._waiting[env] or not all(t in heard for t in self._waiting[env]):
                return
            if self._waiting[env] is _STEP_TOPICS:
                self.steps += 1
                if self._terminal[env]:
                    self._terminal[env] = False
                    self._waiting[env] = ()
                    heard.clear()
                    future = self._resets[env].call_async(Trigger.Request())
                    future.add_done_callback(lambda _: self._after_reset(env))
                    return
            self._step(env)

        return callback

    def _after_reset(self, env: int) -> None:
        # the reset's fresh t and a may already be here
        self._waiting[env] = _RESET_TOPICS
        if all(t in self._heard[env] for t in _RESET_TOPICS):
            self._step(env)

    def _report(self) -> None:
        print(json.dumps({"t": time.monotonic(), "steps": self.steps}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=1)
    parser.add_argument("--action-dim", type=int, default=2)
    parser.add_argument("--executor", choices=("single", "events"), default="single", help="rclpy executor")
    args = parser.parse_args()
    init_ros(None)
    node = LockstepClient(args.envs, args.action_dim)
    return spin_until_shutdown(node, make_executor(args.executor))


if __name__ == "__main__":
    sys.exit(main())
