"""Test session setup: each test process gets its own ROS 2 domain and stays on this machine."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

# Before anything imports rclpy: ROS must find the wheels' packages, keep DDS
# on loopback, and not cross-talk between pytest-xdist workers.
_venv = Path(sys.prefix)
os.environ.setdefault("AMENT_PREFIX_PATH", str(_venv))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.setdefault("ROS_HOME", tempfile.mkdtemp(prefix="plugrl-ros-home-"))
_worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
_index = int("".join(ch for ch in _worker if ch.isdigit()) or 0)
# PLUGRL_TEST_DOMAIN_BASE lets two suites share a machine (each worker uses base + 10 * index).
_base = int(os.environ.get("PLUGRL_TEST_DOMAIN_BASE", "20"))
os.environ["ROS_DOMAIN_ID"] = str(_base + (_index % 8) * 10)
