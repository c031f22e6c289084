"""The timing reference: a bare rclpy timer that publishes a stamped JointState every period.

Run: ``python bench/timer_node.py --rate HZ [--topic reference/arm_cmd] [--listen robot0 --camera raw640]``.

It runs beside the bridge during ``bench_timing.py``, under the same load, and
does nothing but what any rclpy control loop must do (the executor, the
timer, one publish), so its intervals are the floor of timing precision on
this machine at that moment. With ``--listen`` it also subscribes to that
robot's sensors as the bridge does (the two cameras and the joint states,
serialized, the bridge's QoS, on the bridge's executor) and keeps only the
newest message of each: its CPU is the floor of what any rclpy node that
receives those sensors spends.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import rclpy
from rclpy.node import Node
from sensor_msgs.msg import CompressedImage, Image, JointState

from plugrl_ros.node.process import make_executor
from plugrl_ros.ros.qos import qos_profile
from plugrl_ros.ros.spin import spin_until_shutdown

CAMERAS = ("cam0", "cam1")  # bench_observation.CAMERAS (not imported: it would load OpenCV here)


class TimerNode(Node):
    def __init__(self, rate: float, topic: str, listen: str = "", camera: str = "none") -> None:
        super().__init__("plugrl_bench_timer")
        self._publisher = self.create_publisher(JointState, topic, 10)
        self._msg = JointState(name=["joint0"], position=[0.0])
        self.create_timer(1.0 / rate, self._tick)
        self.latest: dict[str, Any] = {}
        if listen:
            self._listen(f"{listen}/joint_states", JointState)
            if camera != "none":
                jpeg = camera.startswith("jpeg")
                for cam in CAMERAS:
                    name = f"{listen}/{cam}/image" + ("/compressed" if jpeg else "")
                    self._listen(name, CompressedImage if jpeg else Image)

    def _listen(self, topic: str, msg_type: type) -> None:
        def keep(msg: Any) -> None:
            self.latest[topic] = msg

        self.create_subscription(msg_type, topic, keep, qos_profile("sensor_data", 5), raw=True)

    def _tick(self) -> None:
        self._msg.header.stamp = self.get_clock().now().to_msg()
        self._publisher.publish(self._msg)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--topic", default="reference/arm_cmd")
    parser.add_argument("--listen", default="", help="also subscribe to this robot's sensors, as the bridge does")
    parser.add_argument("--camera", default="none", choices=("none", "raw224", "raw640", "jpeg640"))
    args = parser.parse_args()
    rclpy.init()
    node = TimerNode(args.rate, args.topic, args.listen, args.camera)
    return spin_until_shutdown(node, make_executor("events") if args.listen else None)


if __name__ == "__main__":
    sys.exit(main())
