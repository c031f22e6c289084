"""Dead-link detection in the websocket client, against a real websockets server that stops answering.

The TCP-level means (keepalive, ``TCP_USER_TIMEOUT``) are checked on the
clients' real sockets. No protocol rules are involved: the client only times the answer to an
``infer`` (and the metadata, the connection's first answer), so the server
here speaks raw frames and the client is driven directly.
"""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from websockets.asyncio.server import serve

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.client import ClientSettings, CloseKind, Connected, Disconnected, FrameReceived, TrainerClient
from plugrl_ros.protocol.connection import Outgoing
from plugrl_ros.protocol.policy.client import PolicyClient
from plugrl_ros.protocol.policy.session import Expectation

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


def client_socket_options(peer_port: int, local_port: int) -> dict[str, int]:
    """The TCP options of this process's real socket from ``local_port`` to ``peer_port`` (read via a dup of its fd)."""
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            sock = socket.socket(fileno=os.dup(fd))  # the family and type are read from the descriptor
        except OSError:
            continue  # not a socket (or closed meanwhile)
        with sock:
            if sock.family is not socket.AF_INET or sock.type is not socket.SOCK_STREAM:
                continue
            try:
                if sock.getsockname()[1] != local_port or sock.getpeername()[1] != peer_port:
                    continue
            except OSError:
                continue  # not connected
            options = {"SO_KEEPALIVE": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)}
            for name in ("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT", "TCP_USER_TIMEOUT"):
                options[name] = sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, name))
            return options
    raise AssertionError(f"no socket from port {local_port} to {peer_port} in this process")


async def options_of_the_client_socket(make_client, tcp_timeout_s: float) -> dict[str, int]:
    """Start a client (``make_client(settings, emit)``) against a server that sends one frame; its socket's options."""
    seen: asyncio.Future = asyncio.get_running_loop().create_future()

    async def handler(ws):
        await ws.send(codec.packb({"action_horizon": 2}))  # metadata, for either client
        if not seen.done():
            seen.set_result(ws.remote_address[1])
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        settings = ClientSettings(uri=f"ws://127.0.0.1:{port}", tcp_timeout_s=tcp_timeout_s)
        connected = asyncio.Event()
        client = make_client(settings, lambda event: connected.set() if type(event).__name__ in CONNECTED else None)
        task = asyncio.ensure_future(client.run())
        try:
            local_port = await asyncio.wait_for(seen, 30)
            await asyncio.wait_for(connected.wait(), 30)  # the client has its connection (and set its options)
            return client_socket_options(port, local_port)
        finally:
            client.stop()
            await asyncio.wait_for(task, 30)


CONNECTED = ("Connected", "PolicyConnected")
CLIENTS = {
    "trainer": TrainerClient,
    "policy server": lambda settings, emit: PolicyClient(settings, Expectation("actions", 0, 0, 1), emit),
}


@pytest.mark.parametrize("which", sorted(CLIENTS))
def test_keepalive_and_tcp_user_timeout_are_set_on_the_client_s_real_socket(which):
    options = asyncio.run(options_of_the_client_socket(CLIENTS[which], tcp_timeout_s=12.0))
    # idle a third of the bound, then three probes a sixth apart; unacknowledged data at most the bound
    assert options == {
        "SO_KEEPALIVE": 1,
        "TCP_KEEPIDLE": 4,
        "TCP_KEEPINTVL": 2,
        "TCP_KEEPCNT": 3,
        "TCP_USER_TIMEOUT": 12000,
    }, options


@pytest.mark.parametrize("which", sorted(CLIENTS))
def test_tcp_timeout_0_leaves_the_operating_system_s_defaults(which):
    options = asyncio.run(options_of_the_client_socket(CLIENTS[which], tcp_timeout_s=0.0))
    assert options["SO_KEEPALIVE"] == 0 and options["TCP_USER_TIMEOUT"] == 0, options
