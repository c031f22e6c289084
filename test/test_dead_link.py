"""Dead-link detection in the websocket client, against a real websockets server that stops answering.

No protocol rules are involved: the client only times the answer to an
``infer`` (and the metadata, the connection's first answer), so the server
here speaks raw frames and the client is driven directly.
"""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.server import serve

from plugrl_ros.protocol.client import ClientSettings, CloseKind, Connected, Disconnected, FrameReceived, TrainerClient
from plugrl_ros.protocol.connection import Outgoing

pytestmark = pytest.mark.websockets


def infer() -> Outgoing:
    return Outgoing("infer", (0,), lambda: {"type": "infer"})


async def drive(handler, bounds: dict, sends: int) -> list:
    """Run a client against ``handler``; it sends an infer after each frame, up to ``sends``; returns the events."""
    events: list = []
    done = asyncio.Event()

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        settings = ClientSettings(uri=f"ws://127.0.0.1:{port}", reconnect_initial_s=30.0, **bounds)
        sent = 0

        def emit(event) -> None:
            nonlocal sent
            events.append(event)
            if isinstance(event, FrameReceived) and sent < sends:
                sent += 1
                client.send(event.epoch, infer())
            if isinstance(event, Disconnected):
                done.set()

        client = TrainerClient(settings, emit)
        task = asyncio.ensure_future(client.run())
        try:
            await asyncio.wait_for(done.wait(), 60)
        finally:
            client.stop()
            await asyncio.wait_for(task, 30)
    return events


def test_a_trainer_that_stops_answering_is_a_lost_link_named_by_its_setting():
    async def answers_twice(ws):
        await ws.send(b"metadata")
        await ws.recv()
        await ws.send(b"action")
        await ws.recv()  # the second infer gets no answer, and the connection stays open
        await ws.wait_closed()

    settings = {"first_answer_timeout_s": 30.0, "answer_timeout_s": 0.5}
    events = asyncio.run(drive(answers_twice, settings, sends=2))
    closed = [e for e in events if isinstance(e, Disconnected)]
    assert closed and closed[0].kind is CloseKind.LOST, events
    assert "trainer.answer_timeout_s" in closed[0].detail, closed[0].detail


def test_a_slow_first_answer_is_allowed_up_to_its_own_bound():
    async def slow_first(ws):
        await ws.send(b"metadata")
        await ws.recv()
        await asyncio.sleep(1.0)  # the model compiling: longer than the steady bound
        await ws.send(b"action")
        await ws.recv()
        await ws.wait_closed()

    settings = {"first_answer_timeout_s": 30.0, "answer_timeout_s": 0.3}
    events = asyncio.run(drive(slow_first, settings, sends=2))
    frames = [e.frame for e in events if isinstance(e, FrameReceived)]
    assert frames == [b"metadata", b"action"], events  # the slow first action came through
    closed = [e for e in events if isinstance(e, Disconnected)]
    assert "trainer.answer_timeout_s" in closed[0].detail, closed[0].detail  # then the steady bound applied


def test_a_missing_metadata_trips_the_first_answer_bound():
    async def silent(ws):
        await ws.wait_closed()

    events = asyncio.run(drive(silent, {"first_answer_timeout_s": 0.3, "answer_timeout_s": 30.0}, sends=0))
    assert isinstance(events[0], Connected), events
    closed = [e for e in events if isinstance(e, Disconnected)]
    assert "trainer.first_answer_timeout_s" in closed[0].detail, closed[0].detail


def test_with_no_bound_a_silent_trainer_is_waited_for():
    async def silent_then_close(ws):
        await asyncio.sleep(1.0)
        await ws.close(1001, "plugrl-server-resync")

    events = asyncio.run(drive(silent_then_close, {}, sends=0))
    closed = [e for e in events if isinstance(e, Disconnected)]
    assert closed[0].kind is CloseKind.RESYNC, events  # the trainer's close, not a timeout of ours
