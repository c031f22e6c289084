"""Every message leaves the client as exactly one websocket frame, against real websockets.

The protocol's framing rule is "binary frames only, one message per frame": a
trainer may read frames rather than reassembled messages. Sending large
arrays as the fragments of one message would save a copy of the images, and
break such a trainer; this holds the client to the rule, large messages
(three 640x480 cameras) included.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.server import serve

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.client import ClientSettings, Connected, Disconnected, TrainerClient
from plugrl_ros.protocol.connection import Outgoing

pytestmark = pytest.mark.websockets

RNG = np.random.default_rng(11)
CAMERAS = [RNG.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(3)]


def large_message() -> dict:
    rows = codec.StackedRows(CAMERAS, np.dtype(np.uint8))
    return {"type": "infer", "data": {"images": {"cam": rows}, "state": np.arange(14.0)}, "envs": [0, 1, 2]}


def small_message() -> dict:
    return {"type": "infer", "data": {"state": np.arange(14.0)}, "envs": [0]}


def send_to(handler: Any, messages: list[dict]) -> TrainerClient:
    """Connect a client to a server running ``handler``, send ``messages`` once connected, wait for the close."""

    async def run() -> TrainerClient:
        done = asyncio.Event()
        async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
            port = server.sockets[0].getsockname()[1]
            settings = ClientSettings(uri=f"ws://127.0.0.1:{port}", reconnect_initial_s=30.0)

            def emit(event: Any) -> None:
                if isinstance(event, Connected):
                    for message in messages:
                        client.send(event.epoch, Outgoing("infer", (0,), lambda m=message: m))
                if isinstance(event, Disconnected):
                    done.set()

            client = TrainerClient(settings, emit)
            task = asyncio.ensure_future(client.run())
            try:
                await asyncio.wait_for(done.wait(), 60)
            finally:
                client.stop()
                await asyncio.wait_for(task, 30)
        return client

    return asyncio.run(run())


def test_every_message_large_or_small_arrives_as_one_frame_holding_exactly_the_packb_bytes() -> None:
    received: list[list[bytes]] = []

    async def handler(ws: Any) -> None:
        for _ in range(2):
            received.append([fragment async for fragment in ws.recv_streaming()])
        await ws.close()

    client = send_to(handler, [large_message(), small_message()])
    large, small = received
    assert large == [codec.packb(large_message())]  # one frame: no continuation frames
    assert small == [codec.packb(small_message())]
    assert client.frames_sent == 2
    assert client.bytes_sent == len(codec.packb(large_message())) + len(codec.packb(small_message()))


def test_a_trainer_reading_whole_messages_gets_one_msgpack_message_per_send() -> None:
    received: list[Any] = []

    async def handler(ws: Any) -> None:
        received.append(await ws.recv())
        received.append(await ws.recv())
        await ws.close()

    send_to(handler, [large_message(), small_message()])
    assert [type(m) for m in received] == [bytes, bytes]
    decoded = codec.unpackb(received[0])
    np.testing.assert_array_equal(decoded["data"]["images"]["cam"], np.stack(CAMERAS))
    np.testing.assert_array_equal(decoded["data"]["state"], np.arange(14.0))
    assert received[1] == codec.packb(small_message())
