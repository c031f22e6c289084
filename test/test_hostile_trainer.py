"""A hostile or buggy trainer: every malformed message is a protocol error, never a crash or a step.

The client stack (rollout core + websocket client, through the headless
probe) talks to a raw websocket server that answers its first infer with a
crafted frame. A correct client logs the error, closes that connection with
1002, reconnects, and never applies anything from the bad frame.
"""

from __future__ import annotations

import asyncio
import os
import resource

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.client import ClientSettings, CloseKind
from plugrl_ros.protocol.connection import Connection
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.tools.headless_probe import HeadlessProbe, HeadlessSettings
from plugrl_ros.tools.probe_env import ProbeEnvs

pytestmark = [pytest.mark.websockets]

H, D = 4, 2


def ndarray_map(data: bytes, dtype: str, shape: list) -> dict:
    """An ndarray map as a hostile peer may write it: nothing checked."""
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


def action_message(env_ids, action) -> bytes:
    return codec.packb({"message_type": "action", "data": {"env_ids": env_ids, "action": action}})


def raw(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def good_action(envs) -> np.ndarray:
    return np.ones((H, len(envs), D), dtype="<f4")


def _nested(depth: int) -> bytes:
    # built by hand: msgpack's own packer refuses to nest this deep
    return b"\x81\xa1k" * depth + b"\xc0"


HOSTILE = {
    "wrong horizon": lambda envs: action_message(np.array(envs), np.ones((H - 1, len(envs), D), "<f4")),
    "wrong env count": lambda envs: action_message(np.array(envs), np.ones((H, len(envs) + 1, D), "<f4")),
    "wrong action width": lambda envs: action_message(np.array(envs), np.ones((H, len(envs), D + 1), "<f4")),
    "mismatched env_ids": lambda envs: action_message(np.array(envs)[::-1] + 1, good_action(envs)),
    "duplicate env_ids": lambda envs: action_message(np.array([envs[0]] * len(envs)), good_action(envs)),
    "NaN": lambda envs: action_message(np.array(envs), np.full((H, len(envs), D), np.nan, "<f4")),
    "inf": lambda envs: action_message(np.array(envs), np.full((H, len(envs), D), np.inf, "<f8")),
    "object dtype": lambda envs: raw(
        {
            "message_type": "action",
            "data": {"action": ndarray_map(b"\0" * 8 * H * len(envs) * D, "|O8", [H, len(envs), D])},
        }
    ),
    "void dtype": lambda envs: raw(
        {
            "message_type": "action",
            "data": {"action": ndarray_map(b"\0" * 4 * H * len(envs) * D, "|V4", [H, len(envs), D])},
        }
    ),
    "complex dtype": lambda envs: raw(
        {
            "message_type": "action",
            "data": {"action": ndarray_map(b"\0" * 8 * H * len(envs) * D, "<c8", [H, len(envs), D])},
        }
    ),
    "data too short": lambda envs: raw(
        {"message_type": "action", "data": {"action": ndarray_map(b"\0" * 3, "<f4", [H, len(envs), D])}}
    ),
    "data too long": lambda envs: raw(
        {
            "message_type": "action",
            "data": {"action": ndarray_map(b"\0" * 4 * (H * len(envs) * D + 1), "<f4", [H, len(envs), D])},
        }
    ),
    "absurd shape": lambda envs: raw(
        {"message_type": "action", "data": {"action": ndarray_map(b"\0" * 8, "<f8", [2**40, len(envs), D])}}
    ),
    "not a map": lambda envs: raw([1, 2, 3]),
    "a bare number": lambda envs: raw(7),
    "unknown message_type": lambda envs: raw({"message_type": "gimme", "data": {}}),
    "bytes instead of str keys": lambda envs: raw({b"message_type": b"action", b"data": {}}),
    "message_type not a str": lambda envs: raw({"message_type": 3, "data": {}}),
    "data not a map": lambda envs: raw({"message_type": "action", "data": [1, 2]}),
    "action missing": lambda envs: raw({"message_type": "action", "data": {"env_ids": []}}),
    "garbage msgpack": lambda envs: b"\xc1\xff\x00garbage",
    "truncated frame": lambda envs: action_message(np.array(envs), good_action(envs))[:-5],
    "deeply nested": lambda envs: _nested(200_000),
    "a second metadata": lambda envs: raw({"message_type": "metadata", "data": {}}),
    "msgpack ext type": lambda envs: raw({"message_type": "action", "data": {"action": msgpack.ExtType(5, b"x")}}),
}


async def _hostile_server(bad_frame, n_envs: int, log: list):
    """Answers the first infer of the first connection with ``bad_frame``, then serves properly and stops."""
    connections = {"count": 0}

    async def handler(ws):
        connections["count"] += 1
        number = connections["count"]
        metadata = {"action_horizon": H, "action_dim": D}
        await ws.send(codec.packb({"message_type": "metadata", "data": metadata}))
        try:
            infer = codec.unpackb(await ws.recv())
            envs = infer["env_indices"].tolist()
            if number == 1:
                await ws.send(bad_frame(envs))
                await ws.recv()  # the client must close now: nothing else may arrive
                log.append("client kept talking")
                return
            await ws.send(action_message(np.array(envs), good_action(envs) * 0.5))
            await ws.recv()  # its feedback
            await ws.close(1001, "plugrl-server-stop")
        except ConnectionClosed as closed:
            log.append((number, closed.rcvd.code if closed.rcvd else None))

    return await serve(handler, "127.0.0.1", 0, compression=None, max_size=None, ping_interval=None)


class _CountingProbe(HeadlessProbe):
    """Records every action the probe envs actually applied."""

    applied: list

    def __init__(self, settings):
        self.applied = []

        def make_envs(n, d):
            envs = ProbeEnvs(n, d)
            step = envs.step

            def recording_step(env, action):
                self.applied.append(np.array(action))
                return step(env, action)

            envs.step = recording_step
            return envs

        super().__init__(settings, make_envs=make_envs)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_malformed_action_is_a_protocol_error_and_never_applied(name):
    log: list = []

    async def scenario():
        server = await _hostile_server(HOSTILE[name], 2, log)
        port = server.sockets[0].getsockname()[1]
        settings = ClientSettings(uri=f"ws://127.0.0.1:{port}", reconnect_initial_s=0.05, reconnect_max_s=0.1)
        probe = _CountingProbe(HeadlessSettings(settings, n_envs=2))
        kinds = []
        original = probe.on_event

        def on_event(event):
            kinds.append(getattr(event, "kind", None))
            original(event)

        probe.client._emit = on_event
        code = await asyncio.wait_for(probe.run(), 30)
        server.close()
        await server.wait_closed()
        return code, probe, kinds

    code, probe, kinds = asyncio.run(scenario())
    assert code == 0  # the run still finished normally on the second connection
    assert CloseKind.ABORTED in kinds  # the bad connection was closed by the client ...
    assert (1, 1002) in log, log  # ... with 1002 (protocol error)
    assert "client kept talking" not in log
    # only the good chunk (values 0.5) was ever applied
    assert probe.applied and all(np.all(a == 0.5) for a in probe.applied)


def test_huge_metadata_is_accepted_without_blowing_up_memory():
    padding = os.urandom(64 * 1024 * 1024)

    async def scenario():
        async def handler(ws):
            metadata = {"padding": padding, "nested": {"a": [1] * 1000}, "action_horizon": H, "action_dim": D}
            await ws.send(codec.packb({"message_type": "metadata", "data": metadata}))
            infer = codec.unpackb(await ws.recv())
            envs = infer["env_indices"].tolist()
            await ws.send(action_message(np.array(envs), good_action(envs)))
            await ws.recv()
            await ws.close(1001, "plugrl-server-stop")

        async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
            port = server.sockets[0].getsockname()[1]
            probe = HeadlessProbe(HeadlessSettings(ClientSettings(uri=f"ws://127.0.0.1:{port}"), n_envs=1))
            return await asyncio.wait_for(probe.run(), 60)

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert asyncio.run(scenario()) == 0
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 64 * 6  # a few copies of the frame at most, never an unbounded expansion


# -- the action validator, fuzzed ---------------------------------------------

_DTYPES = ["|b1", "|u1", "<u2", "<i4", "<i8", ">i8", "<f2", "<f4", ">f4", "<f8", "|i1", "<U3"]
_FUZZ_EXAMPLES = int(os.environ.get("ACTION_FUZZ_EXAMPLES", "300"))


@st.composite
def action_like(draw):
    """Messages near a valid action: right or wrong types, shapes, ids and values."""
    n = draw(st.integers(1, 4))
    envs = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n, unique=True))
    if draw(st.integers(0, 3)):
        # mostly near-valid: float [H >= 1, n, d >= 1], values that may be NaN, inf or huge
        dtype = draw(st.sampled_from(["<f4", ">f4", "<f8", "<f2"]))
        shape = (draw(st.integers(1, 5)), n, draw(st.integers(1, 3)))
        elements = st.floats(allow_nan=True, allow_infinity=True, width=8 * np.dtype(dtype).itemsize)
        action = draw(hnp.arrays(np.dtype(dtype), shape, elements=elements))
    else:
        dtype = draw(st.sampled_from(_DTYPES))
        shape = draw(
            st.one_of(
                st.tuples(st.integers(0, 5), st.just(n), st.integers(0, 3)),
                hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4),
            )
        )
        action = draw(hnp.arrays(np.dtype(dtype), shape))
    data: dict = {"action": action}
    if draw(st.booleans()):
        data["env_ids"] = draw(
            st.one_of(
                st.just(np.array(envs, dtype="<i8")),
                hnp.arrays(np.dtype("<i8"), st.integers(0, 5), elements=st.integers(-2, 8)),
                st.lists(st.integers(0, 6)),
                st.text(max_size=3),
            )
        )
    message = {"message_type": draw(st.sampled_from(["action", "action", "metadata", "x"])), "data": data}
    if draw(st.integers(0, 9)) == 0:
        message = draw(st.sampled_from([[message], {"data": data}, {"message_type": "action"}, None]))
    return envs, message


@settings(max_examples=_FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(action_like())
def test_the_action_validator_either_returns_a_safe_chunk_or_raises_a_protocol_error(case):
    envs, message = case
    conn = Connection()
    conn.receive(codec.packb({"message_type": "metadata", "data": {}}))
    rows = [ObservationRow(states={"t": np.zeros(1)})] * len(envs)
    conn.infer(envs, [0] * len(envs), rows)
    try:
        frame = codec.packb(message)
    except (TypeError, ValueError):
        return  # not something a peer can even send
    try:
        chunk = conn.receive(frame)
    except ProtocolError:
        assert not conn.holding  # a refused action gives no env a chunk
        return
    assert list(chunk.env_ids) == envs
    assert chunk.actions.dtype == np.float64 and chunk.actions.ndim >= 2
    assert chunk.actions.shape[0] >= 1 and chunk.actions.shape[1] == len(envs)
    assert np.isfinite(chunk.actions).all()


def test_an_operator_frame_cap_refuses_an_oversized_frame_and_reconnects():
    from plugrl_ros.protocol.client import Disconnected, TrainerClient

    events = []

    async def scenario():
        async def handler(ws):
            await ws.send(codec.packb({"message_type": "metadata", "data": {"padding": b"x" * 2_000_000}}))
            await asyncio.sleep(5)

        async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
            port = server.sockets[0].getsockname()[1]
            settings = ClientSettings(uri=f"ws://127.0.0.1:{port}", max_frame_bytes=1_000_000)

            def on_event(event):
                events.append(event)
                if isinstance(event, Disconnected):
                    client.stop()

            client = TrainerClient(settings, on_event)
            await asyncio.wait_for(client.run(), 30)

    asyncio.run(scenario())
    closes = [e for e in events if isinstance(e, Disconnected)]
    assert closes and "1009" in closes[0].detail  # message too big: refused before it was held
