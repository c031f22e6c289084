"""PlugRLEnvRunner against the server checklist (docs/protocol.md), as the demo trainer is held to it.

The same client as test_demo_trainer_checklist.py, on real websockets: ragged
batches, a feedback env set unlike the infer's, a frame over 1 MiB, two
connections both using env 0, reuse; then the errors that must close only that
connection with ``plugrl-server-resync`` while the runner goes on. A thread
calls ``sample()`` over and over, as an algorithm does.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from test_demo_trainer_checklist import Client, run
from websockets.asyncio.client import connect

from plugrl_ros.protocol.client import RESYNC_REASON
from plugrl_ros.protocol.codec import packb

pytestmark = [pytest.mark.rllib, pytest.mark.websockets]


@pytest.fixture(scope="module")
def port():
    from rllib_client import make_runner

    runner = make_runner(horizon=3, sample_wait_s=0.5)
    done = threading.Event()

    def algorithm() -> None:
        while not done.is_set():
            runner.sample(num_timesteps=50)

    thread = threading.Thread(target=algorithm, daemon=True)
    thread.start()
    yield runner.port
    done.set()
    thread.join(10.0)
    runner.stop()


def test_ragged_batches_unlike_env_sets_and_a_large_frame_are_served(port):
    async def scenario(c: Client) -> None:
        assert (await c.infer([0, 1, 2])).shape == (3, 3, 2)  # time-major [H, n, da]
        await c.feedback([0], done=[True])
        await c.infer([0])
        await c.feedback([1, 2])
        await c.infer([2, 1])
        await c.feedback([0, 2, 1], done=[False, True, False])
        await c.infer([0, 1, 2], big=True)  # about 2.25 MiB, most of it an image the policy does not read
        await c.feedback([0, 1, 2])

    run(port, scenario)


def test_env_indices_are_connection_scoped(port):
    import asyncio

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
    ["an infer without env_indices", "two infers in a row", "an info that cannot be split", "a text frame"],
)
def test_a_protocol_error_closes_that_connection_for_a_resync_and_the_runner_goes_on(port, error):
    from test_demo_trainer_checklist import observation

    async def scenario(c: Client) -> object:
        if error == "an infer without env_indices":
            message = {"message_type": "infer", "data": observation(1), "step_ids": np.zeros(1, "<i8")}
            await c.ws.send(packb(message))
        elif error == "a text frame":
            await c.ws.send("hello")
        else:
            await c.infer([0, 1])
            if error == "two infers in a row":
                await c.send_infer([0, 1])
            else:
                await c.feedback([0, 1], info={"task": "pick"})
                await c.send_infer([0, 1])
        return await c.closed()

    assert run(port, scenario) == (1001, RESYNC_REASON)

    async def still_serving(c: Client) -> None:
        await c.infer([0])

    run(port, still_serving)
