"""``plugrl-demo-teleop``: a scripted person at a gamepad (sensor_msgs/Joy) for each demo reacher.

For reacher i it reads ``reacher<i>/target`` and publishes ``reacher<i>/joy``
at ``--rate`` Hz: axes 0 and 1 steer the shoulder and elbow toward the target
(full deflection = ``--max-speed`` rad/s), and button ``--button`` is the
deadman, held while the arm strays (see :mod:`plugrl_ros.demo.scripted_person`)
during the run's first ``--minutes``. ``config/demo_intervention.yaml`` is the
bridge's intervention section that reads it.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from rclpy.node import Node
from sensor_msgs.msg import Joy
from std_msgs.msg import Float64MultiArray

from plugrl_ros.demo.scripted_person import PersonSettings, ScriptedPerson
from plugrl_ros.ros.qos import qos_profile
from plugrl_ros.ros.spin import init_ros, spin_until_shutdown
from plugrl_ros.ros_args import without_ros_args

BUTTONS = 8  # a gamepad's buttons


class DemoTeleop(Node):
    """One scripted person per reacher, publishing its gamepad."""

    def __init__(self, envs: int, rate_hz: float, button: int, settings: PersonSettings) -> None:
        super().__init__("plugrl_demo_teleop")
        self._button = button
        self.people = [ScriptedPerson(settings, time.monotonic) for _ in range(envs)]
        self._pads = []
        for i, person in enumerate(self.people):
            ns = f"reacher{i}"
            self._pads.append(self.create_publisher(Joy, f"{ns}/joy", qos_profile("sensor_data", 1)))
            self.create_subscription(
                Float64MultiArray, f"{ns}/target", lambda msg, p=person: p.see(np.asarray(msg.data)), 10
            )
        self.create_timer(1.0 / rate_hz, self._publish)

    def _publish(self) -> None:
        stamp = self.get_clock().now().to_msg()
        for person, pad in zip(self.people, self._pads, strict=True):
            msg = Joy()
            msg.header.stamp = stamp
            msg.axes = person.stick()
            buttons = [0] * max(BUTTONS, self._button + 1)
            buttons[self._button] = int(person.held)
            msg.buttons = buttons
            pad.publish(msg)


def main(args: list[str] | None = None) -> int:
    argv = without_ros_args(sys.argv if args is None else args)[1:]
    parser = argparse.ArgumentParser(prog="plugrl-demo-teleop", description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=2, help="number of reachers (namespaces reacher0, reacher1, ...)")
    parser.add_argument("--rate", type=float, default=20.0, help="gamepad messages per second")
    parser.add_argument("--minutes", type=float, default=3.0, help="help during the first minutes (0: always)")
    parser.add_argument("--button", type=int, default=4, help="the deadman button's index")
    parser.add_argument("--max-speed", type=float, default=2.0, help="rad/s at full deflection (joy.scale)")
    parser.add_argument("--stray", type=float, default=0.15, help="metres from the target the arm may stray")
    parser.add_argument("--patience", type=float, default=1.0, help="seconds it may stray before the person acts")
    parser.add_argument("--release", type=float, default=0.03, help="let go this close to the target (m)")
    options = parser.parse_args(argv)
    if options.envs < 1 or not options.rate > 0 or options.button < 0 or not options.max_speed > 0:
        parser.error("--envs >= 1, --rate > 0, --button >= 0 and --max-speed > 0")
    settings = PersonSettings(
        stray_m=options.stray,
        patience_s=options.patience,
        release_m=options.release,
        max_speed=options.max_speed,
        helping_s=options.minutes * 60.0,
    )
    init_ros(args)
    return spin_until_shutdown(DemoTeleop(options.envs, options.rate, options.button, settings))


if __name__ == "__main__":
    sys.exit(main())
