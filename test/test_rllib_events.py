"""plugrl_ros.rllib.events: an answer delivered after its connection's server stopped is dropped, not raised."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from plugrl_ros.rllib.events import Answer

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


def test_an_answer_for_a_server_that_stopped_is_dropped():
    """runner.stop() closes the websocket thread's loop while sample() may still be answering on another thread:
    the chunk has no connection left to go to, and sample() must not fail with 'Event loop is closed'."""
    loop = asyncio.new_event_loop()
    answer = Answer(loop)
    loop.close()
    answer.deliver(np.zeros((1, 1, 2), np.float32))  # raised RuntimeError before
    assert not answer.future.done()
