"""Test session setup: each test process gets its own ROS 2 domain and stays on this machine."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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
# The servers under test read their API key from PLUGRL_API_KEY by default: one exported in the
# developer's shell would make every test server refuse the test clients. Tests set keys of their own.
os.environ.pop("PLUGRL_API_KEY", None)


@pytest.fixture(autouse=True)
def _websocket_tests_are_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test that opens a websocket connection in this process is marked ``websockets``.

    CI's pass with the oldest supported websockets runs only the marked tests (``.ci/run``),
    so an unmarked one would silently escape it; ``websockets_incidental`` says, on purpose,
    that a test's link is plumbing covered by marked tests. The library's connection class
    is observed here (its own ``__init__`` still runs), not replaced.
    """
    if any(request.node.get_closest_marker(m) is not None for m in ("websockets", "websockets_incidental")):
        yield
        return
    from websockets.asyncio.connection import Connection

    opened: list[str] = []
    original = Connection.__init__

    def observed(self: Connection, *args: Any, **kwargs: Any) -> None:
        opened.append(type(self).__name__)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Connection, "__init__", observed)
    yield
    assert not opened, f"this test opened websocket connections ({', '.join(sorted(set(opened)))}): mark it websockets"


@pytest.fixture(autouse=True, scope="module")
def _ray_ends_with_its_module() -> Iterator[None]:
    """A Ray session a test module started (``build_algo`` starts one by itself) ends with that module.

    Otherwise it lives on in the pytest-xdist worker, and the next module's own ``ray.init(...)`` fails
    ("Maybe you called ray.init twice by accident?"), depending on which worker ran what before it.
    """
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def robot() -> Iterator[Any]:
    """The fake robot of :class:`harness.Robot`: an rclpy node in this process, closed after the test."""
    from harness import Robot  # here, not at the top: a test without ROS does not load rclpy

    fake = Robot()
    try:
        yield fake
    finally:
        fake.close()
