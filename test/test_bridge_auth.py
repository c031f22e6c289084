"""The bridge, as a ROS process with the probe robot, reaches a trainer that wants its API key, over ws:// and wss://.

The trainer is the test trainer with a key (and, for wss://, a certificate from
a CA made here); the bridge gets the key's variable and the CA file as a user
configures them. test_server_auth.py holds each server to the key; this is the
whole path, end to end.
"""

from __future__ import annotations

import secrets

import pytest
import trustme
from harness import TrainerThread, process, python_module, ros_env, wait_until

from plugrl_ros.tools.test_trainer import TrainerSettings

pytestmark = [pytest.mark.ros, pytest.mark.websockets, pytest.mark.slow]

KEY_ENV = "PLUGRL_TEST_BRIDGE_KEY"


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_the_bridge_passes_the_probe_with_the_right_key_over_ws_and_over_wss_with_a_private_ca(
    scheme, tmp_path, monkeypatch
):
    key = "plugrl-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)  # the trainer reads it from this process's environment
    ca = trustme.CA()
    ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    settings = TrainerSettings(
        port=0,
        script=("resync", "stop"),
        feedbacks_per_connection=8,
        metadata_delay_s=0.2,
        grace_s=1.0,
        api_key_env=KEY_ENV,
        tls_cert=str(tmp_path / "server.pem") if scheme == "wss" else "",
    )
    trainer = TrainerThread(settings)
    port = trainer.start()
    uri = f"{scheme}://localhost:{port}"
    command = python_module(
        "plugrl_ros.tools.probe", "--server", uri, "--api-key-env", KEY_ENV, "--ca-file", str(tmp_path / "ca.pem")
    )
    with process(command, env=ros_env(**{KEY_ENV: key})) as probe:
        code = probe.wait(120)
        report = trainer.report(timeout=30)
        output = probe.output()
    assert code == 0, output
    assert report.failed == 0 and not report.incomplete and report.connections == 2, report.text() + output
    assert key not in output  # the bridge never logs the key


def test_the_bridge_without_the_key_is_refused_and_says_what_to_set(tmp_path, monkeypatch):
    key = "plugrl-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    trainer = TrainerThread(TrainerSettings(port=0, script=("stop",), api_key_env=KEY_ENV))
    port = trainer.start()
    try:
        environment = ros_env(**{KEY_ENV: "not-" + key})
        command = python_module(
            "plugrl_ros.tools.probe", "--server", f"ws://localhost:{port}", "--api-key-env", KEY_ENV
        )
        with process(command, env=environment) as probe:
            # the bridge keeps retrying (a key may be rotated while it runs); its warning says why it waits
            wait_until(lambda: "HTTP 401" in probe.output(), 60.0, "the bridge's warning about the refusal")
            output = probe.output()
    finally:
        trainer.end()
        trainer.join(10)
    line = next(line for line in output.splitlines() if "HTTP 401" in line)
    assert "cannot reach the trainer" in line and "api_key_env" in line, output
    assert key not in output
