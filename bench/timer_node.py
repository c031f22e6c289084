"""The timing reference: a bare rclpy timer that publishes a stamped JointState every period.

Run: ``python bench/timer_node.py --rate HZ [--topic reference/arm_cmd]``.

It runs beside the bridge during ``bench_timing.py``, under the same load, and
does nothing but what any rclpy control loop must do (the executor, the
timer, one publish), so its intervals are the floor of timing precision on
this machine at that moment.
"""

from __future__ import annotations

import argparse
import sys

import rclpy
from rclpy.node import Node
from sensor_msgs.msg import JointState

from plugrl_ros.ros.spin import spin_until_shutdown


class TimerNode(Node):
    def __init__(self, rate: float, topic: str) -> None:
        super().__init__("plugrl_bench_timer")
        self._publisher = self.create_publisher(JointState, topic, 10)
        self._msg = JointState(name=["joint0"], position=[0.0])
        self.create_timer(1.0 / rate, self._tick)

    def _tick(self) -> None:
        self._msg.header.stamp = self.get_clock().now().to_msg()
        self._publisher.publish(self._msg)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--topic", default="reference/arm_cmd")
    args = parser.parse_args()
    rclpy.init()
    node = TimerNode(args.rate, args.topic)
    return spin_until_shutdown(node)


if __name__ == "__main__":
    sys.exit(main())
