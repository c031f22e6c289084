"""The policy-server client against real websockets: the test policy server in-process, and as a command.

Handshake, metadata, request and answer; a server traceback (text frame +
1011) reported and followed by a reconnect; a killed and restarted server;
malformed answers that never become actions; the API key sent and never
logged; no compression offered; wss:// with a CA file; the command line.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
import trustme
from websockets.asyncio.server import serve

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.client import ClientSettings, ConnectFailed
from plugrl_ros.protocol.errors import ProtocolMisuse
from plugrl_ros.protocol.policy.client import (
    AnswerRejected,
    ChunkReceived,
    PolicyClient,
    PolicyConnected,
    PolicyDisconnected,
    ServerTraceback,
)
from plugrl_ros.protocol.policy.session import Expectation
from plugrl_ros.tools.test_policy_server import PolicyServerSettings, TestPolicyServer, decode_row

pytestmark = [pytest.mark.websockets]

TIMEOUT = 30


class Events:
    """The client's events, with an event-based wait for one that matches."""

    def __init__(self) -> None:
        self.items: list = []
        self._changed = asyncio.Event()

    def __call__(self, event) -> None:
        self.items.append(event)
        self._changed.set()

    async def wait(self, match: Callable, count: int = 1):
        async def until():
            while True:
                found = [e for e in self.items if match(e)]
                if len(found) >= count:
                    return found[count - 1]
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(until(), TIMEOUT)

    def of(self, kind) -> list:
        return [e for e in self.items if isinstance(e, kind)]


def settings_for(port: int, scheme: str = "ws", **kw) -> ClientSettings:
    return ClientSettings(uri=f"{scheme}://127.0.0.1:{port}", reconnect_initial_s=0.05, reconnect_max_s=0.2, **kw)


def obs(stamp: float) -> dict:
    return {
        "observation/state": np.array([stamp, 0.5]),
        "observation/image": np.zeros((4, 4, 3), np.uint8),
        "prompt": "go",
    }


async def start(server_settings: PolicyServerSettings, expect: Expectation | None = None, **client_kw):
    server = TestPolicyServer(server_settings)
    port = await server.start()
    events = Events()
    client = PolicyClient(settings_for(port, **client_kw), expect or Expectation(), events)
    task = asyncio.ensure_future(client.run())
    return server, client, events, task


async def finish(server: TestPolicyServer, client: PolicyClient, task: asyncio.Future) -> None:
    client.stop()
    await asyncio.wait_for(task, TIMEOUT)
    await server.close()


def test_handshake_metadata_request_and_answer():
    async def scenario():
        server, client, events, task = await start(PolicyServerSettings(horizon=6, action_dim=4))
        connected = await events.wait(lambda e: isinstance(e, PolicyConnected))
        assert connected.metadata.raw == {"action_horizon": 6, "action_dim": 4}
        assert connected.metadata.horizon == 6 and connected.metadata.width == 4
        assert client.request(connected.epoch, obs(7.0), tag="first")
        with pytest.raises(ProtocolMisuse):
            client.request(connected.epoch, obs(8.0))  # one request outstanding
        chunk = await events.wait(lambda e: isinstance(e, ChunkReceived))
        assert chunk.tag == "first" and chunk.chunk.actions.shape == (6, 4) and chunk.round_trip_s >= 0
        assert [decode_row(row) for row in chunk.chunk.actions] == [(0, k, 7.0) for k in range(6)]
        assert chunk.chunk.actions[:, 3].tolist() == [7.0 + k for k in range(6)]
        assert "infer_ms" in chunk.chunk.server_timing
        assert not client.request(connected.epoch + 1, obs(9.0))  # an epoch that does not exist
        assert client.request(connected.epoch, obs(9.0), tag="second")
        second = await events.wait(lambda e: isinstance(e, ChunkReceived), count=2)
        assert second.tag == "second" and decode_row(second.chunk.actions[0]) == (1, 0, 9.0)
        seen = server.seen.observations[0]
        assert seen["prompt"] == "go" and seen["observation/image"].shape == (4, 4, 3)
        await finish(server, client, task)

    asyncio.run(scenario())


@pytest.mark.parametrize("metadata", [{}, {"robot": "droid", "pose": [0.1, 0.2]}, {"action_horizon": "ten"}])
def test_any_metadata_map_is_tolerated(metadata):
    async def scenario():
        server, client, events, task = await start(PolicyServerSettings(horizon=3, action_dim=2, metadata=metadata))
        connected = await events.wait(lambda e: isinstance(e, PolicyConnected))
        assert connected.metadata.raw == metadata and connected.metadata.horizon is None
        client.request(connected.epoch, obs(1.0))
        chunk = await events.wait(lambda e: isinstance(e, ChunkReceived))
        assert chunk.chunk.actions.shape == (3, 2)
        await finish(server, client, task)

    asyncio.run(scenario())


def test_a_server_traceback_is_reported_then_the_client_reconnects():
    async def scenario():
        server, client, events, task = await start(PolicyServerSettings(fail_after=1))
        connected = await events.wait(lambda e: isinstance(e, PolicyConnected))
        client.request(connected.epoch, obs(1.0), tag=0)
        await events.wait(lambda e: isinstance(e, ChunkReceived))
        client.request(connected.epoch, obs(2.0), tag=1)
        failure = await events.wait(lambda e: isinstance(e, ServerTraceback))
        assert "Traceback (most recent call last)" in failure.text and "RuntimeError" in failure.text
        lost = await events.wait(lambda e: isinstance(e, PolicyDisconnected))
        assert lost.code == 1011 and lost.epoch == connected.epoch
        again = await events.wait(lambda e: isinstance(e, PolicyConnected), count=2)
        assert again.epoch == connected.epoch + 1
        client.request(again.epoch, obs(3.0), tag=2)
        chunk = await events.wait(lambda e: isinstance(e, ChunkReceived), count=2)
        assert chunk.tag == 2 and decode_row(chunk.chunk.actions[0])[2] == 3.0
        assert len(events.of(ChunkReceived)) == 2  # the failed request yielded nothing
        await finish(server, client, task)

    asyncio.run(scenario())


def test_a_killed_server_is_reported_and_a_restarted_one_reconnected():
    async def scenario():
        server, client, events, task = await start(PolicyServerSettings(latency_s=5.0))
        port = server._server.sockets[0].getsockname()[1]
        connected = await events.wait(lambda e: isinstance(e, PolicyConnected))
        client.request(connected.epoch, obs(1.0))
        while not server.seen.observations:  # the server holds the request, "computing"
            await asyncio.sleep(0.01)
        await server.kill()  # no close frame
        lost = await events.wait(lambda e: isinstance(e, PolicyDisconnected))
        assert "1006" in lost.detail
        await events.wait(lambda e: isinstance(e, ConnectFailed))
        restarted = TestPolicyServer(PolicyServerSettings(port=port))
        await restarted.start()
        again = await events.wait(lambda e: isinstance(e, PolicyConnected), count=2)
        client.request(again.epoch, obs(2.0))
        chunk = await events.wait(lambda e: isinstance(e, ChunkReceived))
        assert decode_row(chunk.chunk.actions[0]) == (0, 0, 2.0)  # the new server's first chunk
        assert len(events.of(ChunkReceived)) == 1  # nothing of the killed server's request
        await finish(restarted, client, task)

    asyncio.run(scenario())


MALFORMED = [
    ("wrong width", codec.packb({"actions": np.zeros((3, 5), "<f4")})),
    ("wrong horizon", codec.packb({"actions": np.zeros((4, 2), "<f4")})),
    ("nan", codec.packb({"actions": np.array([[0.0, np.nan]] * 3, "<f4")})),
    ("missing key", codec.packb({"action": np.zeros((3, 2), "<f4")})),
    ("not a map", codec.packb([np.zeros((3, 2), "<f4")])),
    ("integers", codec.packb({"actions": np.zeros((3, 2), "<i8")})),
    ("not msgpack", b"\xc1\x00"),
    ("bad ndarray", codec.packb({"actions": {"__ndarray__": True, "data": b"\x00", "dtype": "<f4", "shape": [3, 2]}})),
]


def test_malformed_answers_never_become_actions_and_the_connection_goes_on():
    frames = [frame for _, frame in MALFORMED] + [codec.packb({"actions": np.ones((3, 2), "<f4")})]

    async def handler(ws):
        await ws.send(codec.packb({"action_horizon": 3, "action_dim": 2}))
        for frame in frames:
            await ws.recv()
            await ws.send(frame)
        await ws.wait_closed()

    async def scenario():
        async with serve(handler, "127.0.0.1", 0, compression=None) as server:
            events = Events()
            client = PolicyClient(settings_for(server.sockets[0].getsockname()[1]), Expectation(), events)
            task = asyncio.ensure_future(client.run())
            connected = await events.wait(lambda e: isinstance(e, PolicyConnected))
            for tag in range(len(frames)):
                assert client.request(connected.epoch, obs(1.0), tag=tag)
                await events.wait(lambda e: isinstance(e, (ChunkReceived, AnswerRejected)), count=tag + 1)
            client.stop()
            await asyncio.wait_for(task, TIMEOUT)
        return events

    events = asyncio.run(scenario())
    rejected = events.of(AnswerRejected)
    assert [e.tag for e in rejected] == list(range(len(MALFORMED)))
    for (name, _), event in zip(MALFORMED, rejected, strict=True):
        assert event.detail, name
    [chunk] = events.of(ChunkReceived)
    assert chunk.tag == len(MALFORMED) and chunk.chunk.actions.tolist() == [[1.0, 1.0]] * 3
    assert len(events.of(PolicyConnected)) == 1  # no reconnect for a bad answer


def test_a_text_frame_mid_answer_is_a_traceback_never_an_action():
    async def handler(ws):
        await ws.send(codec.packb({}))
        await ws.recv()
        await ws.send("Traceback (most recent call last):\n  ValueError: boom")
        await ws.close(1011, "Internal server error. Traceback included in previous frame.")

    async def scenario():
        async with serve(handler, "127.0.0.1", 0, compression=None) as server:
            events = Events()
            client = PolicyClient(settings_for(server.sockets[0].getsockname()[1]), Expectation(), events)
            task = asyncio.ensure_future(client.run())
            connected = await events.wait(lambda e: isinstance(e, PolicyConnected))
            client.request(connected.epoch, obs(1.0))
            failure = await events.wait(lambda e: isinstance(e, ServerTraceback))
            lost = await events.wait(lambda e: isinstance(e, PolicyDisconnected))
            await events.wait(lambda e: isinstance(e, PolicyConnected), count=2)
            client.stop()
            await asyncio.wait_for(task, TIMEOUT)
            return events, failure, lost

    events, failure, lost = asyncio.run(scenario())
    assert "ValueError: boom" in failure.text
    assert lost.code == 1011 and "Traceback included" in lost.detail
    assert not events.of(ChunkReceived)


def test_metadata_contradicting_the_configuration_closes_the_connection():
    async def scenario():
        server, client, events, task = await start(PolicyServerSettings(horizon=50), Expectation(horizon=10))
        lost = await events.wait(lambda e: isinstance(e, PolicyDisconnected))
        assert "announces an action horizon of 50, but 10 is configured" in lost.detail and lost.code == 1002
        assert not events.of(PolicyConnected)
        await finish(server, client, task)

    asyncio.run(scenario())


def test_an_aborted_connection_is_reopened_and_its_answer_never_delivered():
    async def scenario():
        server, client, events, task = await start(PolicyServerSettings(latency_s=0.5))
        connected = await events.wait(lambda e: isinstance(e, PolicyConnected))
        client.request(connected.epoch, obs(1.0))
        client.abort(connected.epoch, "no answer within 0.1 s")
        lost = await events.wait(lambda e: isinstance(e, PolicyDisconnected))
        assert "no answer within 0.1 s" in lost.detail
        again = await events.wait(lambda e: isinstance(e, PolicyConnected), count=2)
        client.request(again.epoch, obs(2.0), tag="new")
        chunk = await events.wait(lambda e: isinstance(e, ChunkReceived))
        assert chunk.tag == "new" and len(events.of(ChunkReceived)) == 1
        await finish(server, client, task)

    asyncio.run(scenario())


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(record.getMessage())


def test_the_api_key_is_sent_never_logged_and_no_compression_is_offered(monkeypatch):
    secret = "plugrl-" + secrets.token_hex(16)
    monkeypatch.setenv("PLUGRL_TEST_POLICY_KEY", secret)
    records = _Records()
    root = logging.getLogger()
    root.addHandler(records)
    old_level = root.level
    root.setLevel(logging.DEBUG)

    async def scenario():
        server, client, events, task = await start(PolicyServerSettings(), api_key_env="PLUGRL_TEST_POLICY_KEY")
        connected = await events.wait(lambda e: isinstance(e, PolicyConnected))
        client.request(connected.epoch, obs(1.0))
        await events.wait(lambda e: isinstance(e, ChunkReceived))
        await finish(server, client, task)
        return server, events

    try:
        server, events = asyncio.run(scenario())
    finally:
        root.removeHandler(records)
        root.setLevel(old_level)
    assert server.seen.authorization == [f"Api-Key {secret}"]
    assert server.seen.extensions == [None]  # permessage-deflate not even offered
    assert not [text for text in records.texts + [repr(e) for e in events.items] if secret in text]
    assert any("GET" in text or "HTTP" in text for text in records.texts)  # the handshake was logged, redacted


def test_wss_with_a_ca_file_and_the_health_check(tmp_path):
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))

    async def scenario():
        server, client, events, task = await start(
            PolicyServerSettings(tls_cert=str(tmp_path / "server.pem")), scheme="wss", ca_file=str(tmp_path / "ca.pem")
        )
        connected = await events.wait(lambda e: isinstance(e, PolicyConnected))
        assert connected.uri.startswith("wss://")
        client.request(connected.epoch, obs(1.0))
        await events.wait(lambda e: isinstance(e, ChunkReceived))
        await finish(server, client, task)

    asyncio.run(scenario())


# -- the command ---------------------------------------------------------------------


def _start_command(*args: str) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "plugrl_ros.tools.test_policy_server", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    line = process.stdout.readline()
    assert line.startswith("listening on ws://127.0.0.1:"), (line, process.stderr.read() if process.poll() else "")
    return process, int(line.rsplit(":", 1)[1])


async def _one_chunk(port: int, observation: dict) -> ChunkReceived:
    events = Events()
    client = PolicyClient(settings_for(port), Expectation(), events)
    task = asyncio.ensure_future(client.run())
    connected = await events.wait(lambda e: isinstance(e, PolicyConnected))
    client.request(connected.epoch, observation)
    chunk = await events.wait(lambda e: isinstance(e, ChunkReceived))
    client.stop()
    await asyncio.wait_for(task, TIMEOUT)
    return chunk


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_the_command_serves_answers_health_checks_and_stops_cleanly_on_a_signal(stop):
    process, port = _start_command("--horizon", "4", "--action-dim", "3")
    try:
        chunk = asyncio.run(_one_chunk(port, obs(5.0)))
        assert [decode_row(r) for r in chunk.chunk.actions] == [(0, k, 5.0) for k in range(4)]
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200
        connection.close()
    finally:
        process.send_signal(stop)
        out, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, err
    assert "1 answers" in out and "Traceback" not in err


def test_the_command_serves_a_linear_policy_from_a_file(tmp_path):
    weights = tmp_path / "policy.npz"
    W = np.array([[1.0, 2.0], [0.0, -1.0], [0.5, 0.5]])
    b = np.array([0.1, 0.2, 0.3])
    np.savez(weights, W=W, b=b)
    process, port = _start_command("--linear", str(weights), "--action-dim", "3", "--horizon", "5")
    try:
        chunk = asyncio.run(_one_chunk(port, obs(2.0)))
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=TIMEOUT)
    expected = W @ np.array([2.0, 0.5]) + b
    np.testing.assert_allclose(chunk.chunk.actions, np.repeat(expected[None], 5, axis=0), rtol=1e-6)


def test_the_command_refuses_a_policy_file_of_the_wrong_shape(tmp_path):
    weights = tmp_path / "policy.npz"
    np.savez(weights, W=np.zeros((2, 2)))
    result = subprocess.run(
        [sys.executable, "-m", "plugrl_ros.tools.test_policy_server", "--linear", str(weights), "--action-dim", "3"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 2 and "W must be [3, state_dim]" in result.stderr


def test_the_installed_command_runs():
    command = shutil.which("plugrl-test-policy-server", path=os.path.dirname(sys.executable))
    assert command is not None, "setup.py's console entry is not installed in this venv"
    result = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert result.returncode == 0 and "--linear" in result.stdout


def _trained_learner():
    """A demo learner with learned-looking weights and a normalisation snapshot (8 states: joints, target)."""
    from plugrl_ros.demo.policy_gradient import DemoTrainerSettings, PolicyGradient

    rng = np.random.default_rng(3)
    learner = PolicyGradient(DemoTrainerSettings(seed=3))
    learner.act(rng.standard_normal((4, 8)))  # fixes the state width
    learner.weights = rng.standard_normal(learner.weights.shape)
    learner._norm_mean = rng.standard_normal(8)
    learner._norm_std = rng.uniform(0.2, 3.0, 8)
    return learner, rng


def test_the_demo_s_learned_policy_is_served_by_the_linear_server_as_the_learner_acts(tmp_path):
    from plugrl_ros.demo.results import write_policy

    learner, rng = _trained_learner()
    states = rng.standard_normal((5, 8)) * 2.0
    actions, _, noise = learner.act(states)
    mean = actions - learner.std * noise  # what the learner commands, without its exploration noise
    W, b = learner.linear_policy()
    np.testing.assert_allclose(states @ W.T + b, mean, rtol=1e-9, atol=1e-9)

    path = write_policy(tmp_path, learner)
    process, port = _start_command(
        "--linear", path, "--action-dim", "2", "--horizon", "3", "--stamp-key", "state/joints,state/target"
    )
    try:
        observation = {"state/joints": states[0, :4], "state/target": states[0, 4:], "prompt": "reach"}
        chunk = asyncio.run(_one_chunk(port, observation))
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=TIMEOUT)
    np.testing.assert_allclose(chunk.chunk.actions, np.repeat(mean[:1], 3, axis=0), rtol=1e-5, atol=1e-5)


def test_a_learner_that_saw_no_state_writes_no_policy(tmp_path):
    from plugrl_ros.demo.policy_gradient import DemoTrainerSettings, PolicyGradient
    from plugrl_ros.demo.results import write_policy

    assert write_policy(tmp_path, PolicyGradient(DemoTrainerSettings())) is None
    assert not (tmp_path / "policy.npz").exists()
