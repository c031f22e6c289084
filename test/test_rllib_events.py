"""plugrl_ros.serve.events: an answer reaches its connection's loop from any thread, at once from the loop's own,
and one delivered after its connection's server stopped is dropped, not raised."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from plugrl_ros.serve.events import Answer

pytestmark = [pytest.mark.rllib]


def test_an_answer_reaches_its_future_on_the_connections_loop_from_another_thread():
    loop = asyncio.new_event_loop()
    try:
        answer = Answer(loop)
        chunk = np.zeros((1, 1, 2), np.float32)
        sender = threading.Thread(target=answer.deliver, args=(chunk,))
        sender.start()
        sender.join()
        assert loop.run_until_complete(asyncio.wait_for(answer.future, 10.0)) is chunk
    finally:
        loop.close()


def test_an_answer_given_on_the_loops_own_thread_is_set_at_once_without_a_turn_of_the_loop():
    """The runner answers most infers on the websocket thread as it reads them: the chunk must be there when the
    handler returns, so the connection sends it without waiting for its loop to run a callback."""
    loop = asyncio.new_event_loop()
    try:
        answer = Answer(loop)
        chunk = np.zeros((1, 1, 2), np.float32)
        answer.deliver(chunk)
        assert answer.future.done() and answer.future.result() is chunk
    finally:
        loop.close()


def test_an_answer_for_a_server_that_stopped_is_dropped():
    """runner.stop() closes the websocket thread's loop while sample() may still be answering deferred infers on
    its own thread: the chunk has no connection left to go to, and sample() must not fail with 'Event loop is
    closed'."""
    loop = asyncio.new_event_loop()
    answer = Answer(loop)
    loop.close()
    failures: list[BaseException] = []

    def deliver() -> None:
        try:
            answer.deliver(np.zeros((1, 1, 2), np.float32))  # raised RuntimeError before
        except BaseException as exc:
            failures.append(exc)

    sender = threading.Thread(target=deliver)
    sender.start()
    sender.join()
    assert failures == []
    assert not answer.future.done()
