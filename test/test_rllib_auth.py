"""The RLlib runner's port: a bridge without the runner's API key is refused with 401 before any metadata; wss:// works.

A scripted client over real websockets, as in test_rllib_runner.py; the other
shipped servers are held to the same in test_server_auth.py.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import ssl

import pytest

pytest.importorskip("ray.rllib")

import trustme
from rllib_client import WAIT_S, Client, make_runner, run, sampling
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from plugrl_ros.protocol.codec import unpackb
from plugrl_ros.protocol.server_auth import AccessError

pytestmark = [pytest.mark.rllib, pytest.mark.ros, pytest.mark.websockets]

KEY_ENV = "PLUGRL_TEST_RUNNER_KEY"


@pytest.fixture
def key(monkeypatch) -> str:
    secret = "plugrl-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, secret)
    return secret


@pytest.fixture
def tls(tmp_path):
    ca = trustme.CA()
    ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return tmp_path / "server.pem", tmp_path / "ca.pem"


async def _connect(uri: str, ca, key: str | None) -> Client:
    headers = {"Authorization": f"Api-Key {key}"} if key is not None else None
    context = ssl.create_default_context(cafile=str(ca)) if uri.startswith("wss://") else None
    ws = await connect(uri, compression=None, max_size=None, additional_headers=headers, ssl=context)
    metadata = unpackb(await asyncio.wait_for(ws.recv(), WAIT_S))
    assert metadata["message_type"] == "metadata"
    return Client(ws, metadata["data"])


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_the_runner_refuses_a_missing_or_wrong_key_with_401_and_samples_from_the_right_one(scheme, key, tls, caplog):
    server_pem, ca_pem = tls
    runner = make_runner(api_key_env=KEY_ENV, tls_cert=str(server_pem) if scheme == "wss" else "")
    uri = f"{scheme}://localhost:{runner.port}"
    caplog.set_level(logging.INFO, logger="plugrl_ros.rllib")
    try:

        async def scenario():
            for wrong in (None, "not-" + key):
                with pytest.raises(InvalidStatus) as refused:
                    await asyncio.wait_for(_connect(uri, ca_pem, wrong), WAIT_S)
                assert refused.value.response.status_code == 401
            client = await asyncio.wait_for(_connect(uri, ca_pem, key), WAIT_S)
            sample = await sampling(runner, num_timesteps=1)
            action = await client.infer([0], [[0.0, 0.1, 0.2]])
            await client.feedback([0], [[0.5, 0.5, 0.5]], [1.0])
            episodes = await sample
            await client.ws.close()
            return action, episodes

        action, episodes = run(scenario)
    finally:
        runner.stop()
    assert action.shape == (1, 1, 2)
    assert sum(len(e) for e in episodes) == 1 and episodes[0].get_rewards().tolist() == [1.0]
    refusals = [r.getMessage() for r in caplog.records if "refused a connection from 127.0.0.1" in r.getMessage()]
    assert len(refusals) == 1, refusals  # two refusals within a minute from one peer: one line
    assert all(key not in r.getMessage() for r in caplog.records)


def test_a_runner_whose_key_variable_is_unset_does_not_start_and_names_the_setting(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(AccessError, match=rf'env_config\["plugrl"\]\["api_key_env"\]: got \'{KEY_ENV}\''):
        make_runner(api_key_env=KEY_ENV)


def test_a_runner_settings_tls_key_without_a_certificate_is_refused():
    with pytest.raises(ValueError, match=r'env_config\["plugrl"\]\["tls_key"\]'):
        make_runner(tls_key="key.pem")
