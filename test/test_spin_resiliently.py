"""The bridge's main loop survives a transient rclpy fault, but not a persistent one."""

from __future__ import annotations

from collections import deque

import pytest

from plugrl_ros.node.process import _TRANSIENT_FAULTS_ALLOWED, spin_resiliently

pytestmark = [pytest.mark.ros]


class _Logger:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def error(self, text: str) -> None:
        self.errors.append(text)


class _Node:
    def __init__(self) -> None:
        self.transient_faults: deque[float] = deque()
        self.logger = _Logger()

    def get_logger(self) -> _Logger:
        return self.logger


class _Executor:
    """Fails to take a message on every turn, as rclpy did once with the Jazzy wheels."""

    def spin_once(self, timeout_sec: float) -> None:
        raise RuntimeError("Unable to convert call argument '0' to Python object")


def test_a_lost_message_is_logged_and_the_loop_goes_on():
    node = _Node()
    spin_resiliently(_Executor(), node)
    assert len(node.logger.errors) == 1 and "it is lost, the bridge carries on" in node.logger.errors[0]


def test_a_fault_that_keeps_coming_ends_the_bridge():
    node, executor = _Node(), _Executor()
    for _ in range(_TRANSIENT_FAULTS_ALLOWED):
        spin_resiliently(executor, node)
    with pytest.raises(RuntimeError, match="Unable to convert"):
        spin_resiliently(executor, node)
