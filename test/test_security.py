"""Security posture: TLS verification, the API key never leaking, the warning for an unencrypted link."""

from __future__ import annotations

import asyncio
import http
import logging
import secrets

import pytest
import trustme
from websockets.asyncio.server import serve

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.client import ClientSettings, ConnectFailed, Notice, TrainerClient
from plugrl_ros.tools.headless_probe import HeadlessProbe, HeadlessSettings
from plugrl_ros.tools.test_trainer import TestTrainer, TrainerSettings

pytestmark = [pytest.mark.websockets]


@pytest.fixture
def tls_files(tmp_path):
    """A throwaway CA and a certificate for localhost/127.0.0.1 signed by it."""
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    server.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return tmp_path / "server.pem", tmp_path / "ca.pem"


def test_wss_is_verified_against_the_configured_ca(tls_files):
    server_pem, ca_pem = tls_files

    async def scenario():
        trainer = TestTrainer(
            TrainerSettings(port=0, script=("stop",), feedbacks_per_connection=5, tls_cert=str(server_pem))
        )
        port = await trainer.start()
        client = ClientSettings(uri=f"wss://localhost:{port}", ca_file=str(ca_pem))
        code = await asyncio.wait_for(HeadlessProbe(HeadlessSettings(client, n_envs=2)).run(), 30)
        return code, await trainer.finished(30)

    code, report = asyncio.run(scenario())
    assert code == 0
    assert report.failed == 0 and report.connections == 1, report.text()


def test_wss_to_a_server_the_system_cas_do_not_trust_is_refused(tls_files):
    server_pem, _ = tls_files

    async def scenario():
        trainer = TestTrainer(TrainerSettings(port=0, script=("stop",), tls_cert=str(server_pem)))
        port = await trainer.start()
        failures: list[ConnectFailed] = []

        def on_event(event):
            if isinstance(event, ConnectFailed):
                failures.append(event)
                client.stop()

        client = TrainerClient(ClientSettings(uri=f"wss://localhost:{port}", reconnect_initial_s=0.05), on_event)
        await asyncio.wait_for(client.run(), 30)
        try:
            await trainer.finished(0.5)
        except asyncio.TimeoutError:
            pass  # expected: no client ever completed a handshake, so the script never ran
        return failures, trainer.report

    failures, report = asyncio.run(scenario())
    assert failures and "CERTIFICATE_VERIFY_FAILED" in failures[0].detail
    assert report.connections == 0


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("websockets.server"):
            return  # the test's own server logs the headers it received; only the client side matters
        self.texts.append(record.getMessage())
        if record.exc_info:
            self.texts.append(logging.Formatter().formatException(record.exc_info))


def test_the_api_key_is_sent_from_its_environment_variable_and_never_logged(monkeypatch):
    secret = "plugrl-" + secrets.token_hex(16)
    monkeypatch.setenv("PLUGRL_TEST_API_KEY", secret)
    records = _Records()
    root = logging.getLogger()
    root.addHandler(records)
    old_level = root.level
    root.setLevel(logging.DEBUG)  # websockets logs handshakes (with headers) at DEBUG
    seen_headers: list[str] = []
    events: list[str] = []

    async def handler(ws):
        await ws.send(codec.packb({"message_type": "metadata", "data": {}}))
        await ws.close(1001, "plugrl-server-stop")

    def reject_first(connection, request):
        seen_headers.append(request.headers.get("Authorization", ""))
        if len(seen_headers) == 1:  # refuse once: the error the client reports must not carry the key
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "bad key\n")
        return None

    async def scenario():
        async with serve(handler, "127.0.0.1", 0, process_request=reject_first, compression=None) as server:
            port = server.sockets[0].getsockname()[1]
            settings = ClientSettings(
                uri=f"ws://127.0.0.1:{port}", api_key_env="PLUGRL_TEST_API_KEY", reconnect_initial_s=0.05
            )
            client = TrainerClient(settings, lambda event: events.append(repr(event)))
            return await asyncio.wait_for(client.run(), 30)

    try:
        asyncio.run(scenario())
    finally:
        root.removeHandler(records)
        root.setLevel(old_level)
    assert seen_headers == [f"Api-Key {secret}"] * 2
    assert any("401" in e for e in events), events  # the refusal was reported ...
    leaks = [text for text in records.texts + events if secret in text]
    assert not leaks  # ... but the key appears in no log record, event or error
    assert any("GET" in text or "HTTP" in text for text in records.texts)  # the handshake was logged, redacted


def test_without_the_variable_set_no_authorization_header_is_sent(monkeypatch):
    monkeypatch.delenv("PLUGRL_TEST_API_KEY", raising=False)
    seen: list[str | None] = []

    async def handler(ws):
        seen.append(ws.request.headers.get("Authorization"))
        await ws.send(codec.packb({"message_type": "metadata", "data": {}}))
        await ws.close(1001, "plugrl-server-stop")

    async def scenario():
        async with serve(handler, "127.0.0.1", 0, compression=None) as server:
            port = server.sockets[0].getsockname()[1]
            settings = ClientSettings(uri=f"ws://127.0.0.1:{port}", api_key_env="PLUGRL_TEST_API_KEY")
            await asyncio.wait_for(TrainerClient(settings, lambda event: None).run(), 30)

    asyncio.run(scenario())
    assert seen == [None]


@pytest.mark.parametrize(
    ("uri", "warned"),
    [
        ("ws://192.0.2.1:9", True),  # TEST-NET-1: another host, unencrypted
        ("ws://127.0.0.1:9", False),
        ("ws://localhost:9", False),
        ("wss://192.0.2.1:9", False),
    ],
)
def test_plain_ws_to_another_host_warns_once(uri, warned):
    notices: list[Notice] = []
    failures: list[ConnectFailed] = []

    async def scenario():
        def on_event(event):
            if isinstance(event, Notice):
                notices.append(event)
            elif isinstance(event, ConnectFailed):
                failures.append(event)
                if len(failures) >= 3:
                    client.stop()

        settings = ClientSettings(uri=uri, reconnect_initial_s=0.01, reconnect_max_s=0.02, open_timeout_s=0.2)
        client = TrainerClient(settings, on_event)
        await asyncio.wait_for(client.run(), 30)

    asyncio.run(scenario())
    assert len(failures) >= 3  # it kept trying ...
    assert len(notices) == (1 if warned else 0)  # ... and warned at most once
    if warned:
        assert "unencrypted" in notices[0].text
