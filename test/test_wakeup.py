"""A link thread's wakeup runs its callback on the executor thread, in order and without loss, on both executors."""

from __future__ import annotations

import threading
from collections import deque

import pytest
import rclpy
from rclpy.context import Context
from rclpy.node import Node

from plugrl_ros.node.process import EXECUTOR_VARIABLE, make_executor
from plugrl_ros.params.section import ConfigError
from plugrl_ros.ros.wakeup import Wakeup

pytestmark = [pytest.mark.ros]

_EVENTS = 2000


@pytest.fixture
def context():
    context = Context()
    rclpy.init(context=context)
    yield context
    rclpy.try_shutdown(context=context)


@pytest.mark.parametrize("kind", ["events", "single"])
def test_every_event_from_another_thread_is_delivered_in_order_on_the_executor_thread(context, kind, monkeypatch):
    monkeypatch.delenv(EXECUTOR_VARIABLE, raising=False)
    executor = make_executor(kind, context=context)
    assert type(executor).__name__ == ("EventsExecutor" if kind == "events" else "SingleThreadedExecutor")
    node = Node("plugrl_test_wakeup", context=context)
    queue: deque[int] = deque()
    delivered: list[int] = []
    threads: set[int] = set()

    def deliver() -> None:
        threads.add(threading.get_ident())
        while queue:
            delivered.append(queue.popleft())

    # a fallback period far beyond the test: every delivery must come from a wakeup
    wakeup = Wakeup(node, deliver, None, fallback_period_s=3600.0)
    executor.add_node(node)

    def produce() -> None:
        for i in range(_EVENTS):
            queue.append(i)
            wakeup.trigger()

    producer = threading.Thread(target=produce)
    try:
        producer.start()
        idle_turns = 0  # turns in a row, once every event is queued, that delivered nothing (each waits <= 0.5 s)
        while len(delivered) < _EVENTS and idle_turns < 20:
            done_producing = not producer.is_alive()
            before = len(delivered)
            executor.spin_once(timeout_sec=0.5)
            idle_turns = idle_turns + 1 if done_producing and len(delivered) == before else 0
        producer.join()
    finally:
        executor.shutdown()
        node.destroy_node()
    assert delivered == list(range(_EVENTS))
    assert threads == {threading.get_ident()}


@pytest.mark.parametrize("kind", ["events", "single"])
def test_the_fallback_timer_calls_the_callback_with_no_argument_even_one_that_takes_an_optional_one(context, kind):
    """rclpy's EventsExecutor hands a timer's TimerInfo to a callback that takes a parameter. Deploy mode's drain
    took ``stopping=False``: the info read as True, and every answer the fallback timer drained was dropped."""
    executor = make_executor(kind, context=context)
    node = Node("plugrl_test_wakeup_fallback", context=context)
    calls: list[tuple] = []

    def deliver(stopping: bool = False) -> None:
        calls.append((stopping,))

    Wakeup(node, deliver, None, fallback_period_s=0.02)
    executor.add_node(node)
    try:
        for _ in range(50):  # a hang guard: the timer fires within the first few turns
            executor.spin_once(timeout_sec=0.1)
            if len(calls) >= 3:
                break
    finally:
        executor.shutdown()
        node.destroy_node()
    assert len(calls) >= 3 and set(calls) == {(False,)}, calls


def test_the_executor_is_chosen_by_the_environment_and_a_wrong_name_is_refused(context, monkeypatch):
    monkeypatch.setenv(EXECUTOR_VARIABLE, "single")
    executor = make_executor(context=context)
    assert type(executor).__name__ == "SingleThreadedExecutor"
    executor.shutdown()
    monkeypatch.setenv(EXECUTOR_VARIABLE, "multi")
    with pytest.raises(ConfigError, match="PLUGRL_EXECUTOR: got 'multi'; allowed: events or single"):
        make_executor(context=context)
