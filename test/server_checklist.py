"""The server checklist (docs/protocol.md) as tests any trainer of this package must pass: what a client may do,
and some of what it may not.

A client of its own, written on websockets and the codec: ragged batches, a
feedback env set unlike the infer's, a frame over 1 MiB, two connections both
using env 0, reuse; then the errors that must close only that connection with
``plugrl-server-resync`` while the server goes on. A test module imports the
tests and gives them a ``port`` fixture: the server it holds to the checklist.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from plugrl_ros.protocol.client import RESYNC_REASON
from plugrl_ros.protocol.codec import packb, unpackb

WAIT_S = 30.0  # a hang guard, not a timing claim


def observation(n: int, big: bool = False) -> dict:
    # float32 states and a <U text array, as PlugRL's own server checker sends them
    images = {"padding": np.zeros((n, 512, 512, 3), dtype=np.uint8)} if big else {}
    states = {"obs": np.random.default_rng(n).normal(size=(n, 3)).astype(np.float32)}
    return {"images": images, "states": states, "text": np.asarray(["probe"] * n)}


class Client:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def infer(self, envs: list[int], reuse: list[bool] | None = None, big: bool = False) -> np.ndarray:
        await self.send_infer(envs, reuse, big)
        action = unpackb(await asyncio.wait_for(self.ws.recv(), WAIT_S))
        assert action["message_type"] == "action"
        assert action["data"]["env_ids"].tolist() == envs
        return action["data"]["action"]

    async def send_infer(self, envs: list[int], reuse: list[bool] | None = None, big: bool = False) -> None:
        message = {
            "message_type": "infer",
            "data": observation(len(envs) - sum(reuse or []), big),
            "env_indices": np.asarray(envs, dtype="<i8"),
            "step_ids": np.zeros(len(envs), dtype="<i8"),
        }
        if reuse is not None:
            message["reuse"] = np.asarray(reuse, dtype=bool)
        await self.ws.send(packb(message))

    async def feedback(self, envs: list[int], done: list[bool] | None = None, info: dict | None = None) -> None:
        m = len(envs)
        data = {
            "obs": observation(m),
            "rewards": np.ones(m, dtype="<f4"),
            "terminated": np.asarray(done or [False] * m, dtype=bool),
            "truncated": np.zeros(m, dtype=bool),
            "info": info or {},
        }
        message = {"message_type": "feedback", "env_indices": np.asarray(envs, "<i8"), "step_ids": np.zeros(m, "<i8")}
        await self.ws.send(packb({**message, "data": data}))

    async def closed(self) -> tuple[int, str] | None:
        """How the server closed this connection (None: it answered instead)."""
        try:
            await asyncio.wait_for(self.ws.recv(), WAIT_S)
        except ConnectionClosed as exc:
            return (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd else (1006, "")
        return None


def run(port: int, scenario: Callable[[Client], Awaitable[object]]) -> object:
    async def main() -> object:
        async with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
            metadata = unpackb(await asyncio.wait_for(ws.recv(), WAIT_S))
            assert metadata["message_type"] == "metadata"
            return await scenario(Client(ws))

    return asyncio.run(main())


def test_ragged_batches_unlike_env_sets_and_a_large_frame_are_served(port):
    async def scenario(c: Client) -> None:
        assert (await c.infer([0, 1, 2])).shape == (3, 3, 2)  # time-major [H, n, da]
        await c.feedback([0], done=[True])
        await c.infer([0])
        await c.feedback([1, 2])
        await c.infer([2, 1])
        await c.feedback([0, 2, 1], done=[False, True, False])
        await c.infer([0, 1, 2], big=True)  # about 2.25 MiB
        await c.feedback([0, 1, 2])

    run(port, scenario)


def test_env_indices_are_connection_scoped(port):
    async def both() -> None:
        async def one() -> None:
            async with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
                await ws.recv()
                c = Client(ws)
                for _ in range(3):
                    await c.infer([0])
                    await c.feedback([0])

        await asyncio.gather(one(), one())

    asyncio.run(both())


def test_reuse_is_honoured_after_a_non_terminal_feedback_only(port):
    async def scenario(c: Client) -> object:
        await c.infer([0, 1])
        await c.feedback([0, 1], done=[False, True])
        await c.infer([0, 1], reuse=[True, False])
        await c.feedback([0, 1])
        await c.infer([1, 0], reuse=[True, True])  # every row reused: data has none
        await c.feedback([0, 1], done=[True, False])
        await c.send_infer([0, 1], reuse=[True, False])  # env 0 just ended
        return await c.closed()

    assert run(port, scenario) == (1001, RESYNC_REASON)


@pytest.mark.parametrize(
    "error",
    [
        "an infer without env_indices",
        "two infers in a row",
        "an info that cannot be split",
        "an episode length that is not a number",
        "a text frame",
    ],
)
def test_a_protocol_error_closes_that_connection_for_a_resync_and_the_server_goes_on(port, error):
    async def scenario(c: Client) -> object:
        if error == "an infer without env_indices":
            await c.ws.send(packb({"message_type": "infer", "data": observation(1), "step_ids": np.zeros(1, "<i8")}))
        elif error == "a text frame":
            await c.ws.send("hello")
        else:
            await c.infer([0, 1])
            if error == "two infers in a row":
                await c.send_infer([0, 1])
            elif error == "an episode length that is not a number":
                # a msgpack list: numpy raises OverflowError converting its infinity to a length
                lengths = [math.inf, 3]
                episode = {"r": np.ones(2, "<f4"), "l": lengths, "s": np.zeros(2, bool), "mask": np.ones(2, bool)}
                await c.feedback([0, 1], done=[True, True], info={"episode": episode})
                await c.send_infer([0, 1])
            else:
                await c.feedback([0, 1], info={"task": "pick"})
                await c.send_infer([0, 1])
        return await c.closed()

    assert run(port, scenario) == (1001, RESYNC_REASON)

    async def still_serving(c: Client) -> None:
        await c.infer([0])

    run(port, still_serving)
