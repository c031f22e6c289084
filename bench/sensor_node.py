"""Simulated sensors for benchmarks: per env, cameras and a 14-joint JointState, at fixed rates.

Run: ``python bench/sensor_node.py --envs N [--camera raw640|raw224|jpeg640] [--camera-hz 30] [--joints-hz 100]``.

Env i publishes under ``robot<i>``: ``cam0/image`` and ``cam1/image``
(sensor_msgs/Image rgb8, or ``.../image/compressed`` JPEG CompressedImage)
and ``joint_states``, and listens to ``arm_cmd`` as a robot's driver would
(the bridge starts no chunk before its actuators have a subscriber). The
messages are serialized once at startup and published as bytes, and the
commands are taken serialized and dropped, so this node costs little CPU
next to the bridge it feeds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rclpy
from bench_observation import CAMERAS, image_message, joint_message
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from rclpy.serialization import serialize_message
from sensor_msgs.msg import CompressedImage, Image, JointState

from plugrl_ros.ros.spin import spin_until_shutdown


def _drop(_: bytes) -> None:
    pass


class SensorNode(Node):
    def __init__(self, envs: int, camera: str, camera_hz: float, joints_hz: float) -> None:
        super().__init__("plugrl_bench_sensors")
        self._cameras = []
        self._joints = []
        jpeg = camera.startswith("jpeg")
        for i in range(envs):
            if camera != "none":
                for k, cam in enumerate(CAMERAS):
                    topic = f"robot{i}/{cam}/image" + ("/compressed" if jpeg else "")
                    msg_type = CompressedImage if jpeg else Image
                    publisher = self.create_publisher(msg_type, topic, qos_profile_sensor_data)
                    frames = [serialize_message(image_message(camera, 100 * i + 10 * k + f)) for f in range(3)]
                    self._cameras.append((publisher, frames))
            publisher = self.create_publisher(JointState, f"robot{i}/joint_states", qos_profile_sensor_data)
            self._joints.append((publisher, serialize_message(joint_message(i))))
            self.create_subscription(JointState, f"robot{i}/arm_cmd", _drop, 10, raw=True)
        self._frame = 0
        if self._cameras:
            self.create_timer(1.0 / camera_hz, self._publish_cameras)
        self.create_timer(1.0 / joints_hz, self._publish_joints)

    def _publish_cameras(self) -> None:
        self._frame += 1
        for publisher, frames in self._cameras:
            publisher.publish(frames[self._frame % len(frames)])

    def _publish_joints(self) -> None:
        for publisher, data in self._joints:
            publisher.publish(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=1)
    parser.add_argument("--camera", default="raw640", choices=("none", "raw224", "raw640", "jpeg640"))
    parser.add_argument("--camera-hz", type=float, default=30.0)
    parser.add_argument("--joints-hz", type=float, default=100.0)
    args = parser.parse_args()
    rclpy.init()
    node = SensorNode(args.envs, args.camera, args.camera_hz, args.joints_hz)
    return spin_until_shutdown(node)


if __name__ == "__main__":
    sys.exit(main())
