"""Without the gym extra the package still installs and runs; plugrl-gym-robot says how to get the extra."""

from __future__ import annotations

import subprocess
import sys

from harness import ros_env

# What a venv without Gymnasium sees (a None entry in sys.modules makes its import fail), in any venv.
_WITHOUT_GYMNASIUM = "import sys; sys.modules['gymnasium'] = None; from plugrl_ros.gym.robot_main import main; "


def test_without_the_extra_the_gym_robot_says_how_to_install_it():
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_GYMNASIUM + "sys.exit(main(['plugrl-gym-robot', '--env', 'Pendulum-v1']))"],
        check=False,
        env=ros_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "plugrl-gym-robot: needs Gymnasium" in done.stderr
    assert "pip install 'plugrl_ros[gym]'" in done.stderr
    assert "Traceback" not in done.stderr
