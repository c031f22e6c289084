"""Every shipped server refuses a handshake without its API key (HTTP 401, before any metadata) and serves wss://.

The servers run as the processes a user starts (``plugrl-test-trainer``,
``plugrl-test-policy-server``, ``plugrl-demo-trainer``); the RLlib runner's
share is in test_rllib_auth.py. The bridge's side (the key sent, the server's
certificate verified, the warning for a key over plain ``ws://``) is at the end.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import os
import re
import secrets
import signal
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import trustme
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from plugrl_ros import executables
from plugrl_ros.protocol import codec
from plugrl_ros.protocol.client import ClientSettings, ConnectFailed, Notice, TrainerClient, plain_link_warning
from plugrl_ros.protocol.policy.client import ChunkReceived, PolicyClient, PolicyConnected
from plugrl_ros.protocol.policy.session import Expectation
from plugrl_ros.protocol.server_auth import AccessError, RefusalLog, ServerAccess
from plugrl_ros.tools.headless_probe import HeadlessProbe, HeadlessSettings
from plugrl_ros.tools.test_policy_server import PolicyServerSettings, TestPolicyServer
from plugrl_ros.tools.test_trainer import TestTrainer, TrainerSettings

pytestmark = [pytest.mark.websockets]

KEY_ENV = "PLUGRL_TEST_SERVER_KEY"
WAIT_S = 30.0  # a hang guard, not a timing claim


@dataclass(frozen=True)
class Tls:
    server_pem: Path  # certificate chain and private key, for localhost and 127.0.0.1
    ca_pem: Path  # the CA that signed it
    other_ca_pem: Path  # a CA that did not


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    ca = trustme.CA()
    ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    trustme.CA().cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))
    return Tls(tmp_path / "server.pem", tmp_path / "ca.pem", tmp_path / "other-ca.pem")


# -- the pieces every server shares ----------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(record.getMessage())


def test_refusals_are_logged_once_per_peer_per_interval_with_the_count_held_back():
    now = [100.0]
    logger = logging.getLogger("plugrl_ros.test.refusals")
    records = _Records()
    logger.addHandler(records)
    try:
        refusals = RefusalLog(logger, quiet_s=60.0, clock=lambda: now[0])
        assert refusals.refused("192.0.2.7", "wrong API key")
        for _ in range(5):
            now[0] += 1.0
            assert not refusals.refused("192.0.2.7", "wrong API key")  # the same peer, within the interval
        assert refusals.refused("192.0.2.8", "no API key")  # another peer is reported at once
        now[0] += 60.0
        assert refusals.refused("192.0.2.7", "no API key")
    finally:
        logger.removeHandler(records)
    assert len(records.texts) == 3, records.texts
    assert "192.0.2.7" in records.texts[0] and "wrong API key" in records.texts[0]
    assert "192.0.2.8" in records.texts[1]
    assert "5 more refused" in records.texts[2]


def test_a_named_key_variable_that_is_unset_is_refused_and_the_default_one_leaves_the_server_open(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv("PLUGRL_API_KEY", raising=False)
    with pytest.raises(AccessError, match=f"api_key_env: got '{KEY_ENV}'; the environment variable {KEY_ENV} is not"):
        ServerAccess(api_key_env=KEY_ENV).api_key({})
    assert ServerAccess().api_key({}) is None
    assert ServerAccess().api_key({"PLUGRL_API_KEY": "k"}) == "k"
    assert ServerAccess(api_key_env="").api_key({"PLUGRL_API_KEY": "k"}) is None
    level, text = ServerAccess().describe({}, "0.0.0.0")
    assert level == logging.WARNING and "WITHOUT an API key" in text
    level, text = ServerAccess(api_key_env=KEY_ENV).describe({KEY_ENV: "sesame"}, "0.0.0.0")
    assert level == logging.INFO and f"${KEY_ENV}" in text and "sesame" not in text


def test_a_certificate_that_does_not_load_is_named(tmp_path):
    (tmp_path / "not-a-cert.pem").write_text("hello\n")
    with pytest.raises(AccessError, match=r"tls_cert: cannot load '.*not-a-cert.pem' as a PEM certificate"):
        ServerAccess(tls_cert=str(tmp_path / "not-a-cert.pem")).tls_context()
    with pytest.raises(AccessError, match=r"tls_key: got 'k\.pem' without tls_cert"):
        ServerAccess(tls_key="k.pem").tls_context()


# -- each shipped server, as the process a user starts ----------------------------------------


async def _trainer_exchange(ws) -> None:
    """One infer answered by an action, then a feedback: what every trainer here must serve."""
    n = 2
    observation = {
        "images": {},
        "states": {"obs": np.zeros((n, 3), np.float32)},
        "text": np.asarray(["auth"] * n),
    }
    infer = {
        "message_type": "infer",
        "data": observation,
        "env_indices": np.arange(n, dtype="<i8"),
        "step_ids": np.zeros(n, "<i8"),
    }
    await ws.send(codec.packb(infer))
    action = codec.unpackb(await asyncio.wait_for(ws.recv(), WAIT_S))
    assert action["message_type"] == "action", action
    assert action["data"]["action"].shape[1] == n
    data = {
        "obs": observation,
        "rewards": np.ones(n, "<f4"),
        "terminated": np.zeros(n, bool),
        "truncated": np.zeros(n, bool),
        "info": {},
    }
    feedback = {"message_type": "feedback", "env_indices": np.arange(n, dtype="<i8"), "step_ids": np.zeros(n, "<i8")}
    await ws.send(codec.packb({**feedback, "data": data}))


async def _policy_exchange(ws) -> None:
    await ws.send(codec.packb({"observation/state": np.asarray([7.0], np.float32)}))
    answer = codec.unpackb(await asyncio.wait_for(ws.recv(), WAIT_S))
    assert answer["actions"].shape == (10, 4), answer


SERVERS = {
    "test-trainer": ("plugrl_ros.tools.test_trainer", ("--no-probe", "--script", "stop", "--metadata-delay", "0")),
    "test-policy-server": ("plugrl_ros.tools.test_policy_server", ()),
    "demo-trainer": ("plugrl_ros.demo.trainer", ("--duration", "600", "--horizon", "3", "--action-dim", "2")),
}
EXCHANGES = {
    "test-trainer": _trainer_exchange,
    "test-policy-server": _policy_exchange,
    "demo-trainer": _trainer_exchange,
}


@pytest.fixture
def key(monkeypatch) -> str:
    secret = "plugrl-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, secret)
    return secret


@pytest.fixture(params=["ws", "wss"])
def scheme(request) -> str:
    return request.param


@pytest.fixture(params=sorted(SERVERS))
def server(request, key: str, scheme: str, tls: Tls) -> Iterator[Server]:
    """One shipped server, listening with the key (and TLS for wss)."""
    module, args = SERVERS[request.param]
    tls_args = ("--tls-cert", str(tls.server_pem)) if scheme == "wss" else ()
    command = executables.command(
        module, "--host", "127.0.0.1", "--port", "0", "--api-key-env", KEY_ENV, *args, *tls_args
    )
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    seen: list[str] = []
    running = Server(request.param, "", child, seen)
    try:
        for line in child.stdout:  # ends when the child does: it prints this line once it listens
            seen.append(line)
            found = re.search(r"listening on (wss?)://\S+?:(\d+)", line)
            if found:
                assert found.group(1) == scheme, line
                running.uri = f"{scheme}://localhost:{found.group(2)}"
                break
        else:
            raise AssertionError(f"{module} did not start:\n{''.join(seen)}")
        yield running
    finally:
        running.finish()


@dataclass
class Server:
    name: str
    uri: str
    child: subprocess.Popen
    output: list[str]

    def finish(self) -> str:
        """Stop the server as Ctrl-C does; all it printed."""
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGINT)
        try:
            rest, _ = self.child.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.child.kill()
            rest, _ = self.child.communicate()
        self.output.append(rest or "")
        return "".join(self.output)


async def _open(uri: str, ca: Path | None, key: str | None):
    headers = {"Authorization": f"Api-Key {key}"} if key is not None else None
    context = ssl.create_default_context(cafile=str(ca)) if uri.startswith("wss://") else None
    return await connect(uri, compression=None, max_size=None, additional_headers=headers, ssl=context)


def _refused_with_401(uri: str, ca: Path, key: str | None) -> str:
    async def attempt() -> str:
        with pytest.raises(InvalidStatus) as refused:
            await asyncio.wait_for(_open(uri, ca, key), WAIT_S)
        assert refused.value.response.status_code == 401
        return refused.value.response.body.decode()

    return asyncio.run(attempt())


def test_every_shipped_server_refuses_a_missing_or_wrong_key_with_401_and_serves_the_right_one(server, key, tls):
    body = _refused_with_401(server.uri, tls.ca_pem, None)
    assert "Api-Key" in body  # the refusal says what is missing, and nothing else
    _refused_with_401(server.uri, tls.ca_pem, "not-" + key)
    _refused_with_401(server.uri, tls.ca_pem, key + "x")  # a key that starts right is still wrong

    async def served() -> None:
        ws = await asyncio.wait_for(_open(server.uri, tls.ca_pem, key), WAIT_S)
        try:
            metadata = codec.unpackb(await asyncio.wait_for(ws.recv(), WAIT_S))
            assert isinstance(metadata, dict) and metadata, metadata
            await EXCHANGES[server.name](ws)
        finally:
            await ws.close()

    asyncio.run(served())
    output = server.finish()
    assert key not in output  # the key appears nowhere in what the server says
    refusals = [line for line in output.splitlines() if "refused a connection from 127.0.0.1" in line]
    # three refusals from one peer within a minute: the first is logged, the rest are held back
    assert len(refusals) == 1 and "no API key" in refusals[0], output
    assert f"${KEY_ENV}" in output  # it said at startup which variable holds the key


def test_a_server_whose_key_variable_is_unset_does_not_start_and_says_which_variable(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    for module, args in SERVERS.values():
        command = executables.command(module, "--port", "0", "--api-key-env", KEY_ENV, *args)
        done = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S, check=False)
        assert done.returncode == 2, (module, done.stdout, done.stderr)
        assert f"the environment variable {KEY_ENV} is not set" in done.stderr, (module, done.stderr)
        assert "Traceback" not in done.stderr


# -- the bridge's side ------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_the_bridge_link_connects_with_the_right_key_over_ws_and_over_wss_with_a_private_ca(scheme, key, tls):
    async def scenario():
        settings = TrainerSettings(
            port=0,
            script=("resync", "stop"),
            feedbacks_per_connection=5,
            api_key_env=KEY_ENV,
            tls_cert=str(tls.server_pem) if scheme == "wss" else "",
        )
        trainer = TestTrainer(settings)
        port = await trainer.start()
        client = ClientSettings(
            uri=f"{scheme}://localhost:{port}", api_key_env=KEY_ENV, ca_file=str(tls.ca_pem), reconnect_initial_s=0.05
        )
        code = await asyncio.wait_for(HeadlessProbe(HeadlessSettings(client, n_envs=2)).run(), WAIT_S)
        return code, await trainer.finished(WAIT_S)

    code, report = asyncio.run(scenario())
    assert code == 0
    assert report.failed == 0 and report.connections == 2, report.text()


@pytest.mark.parametrize(
    ("ca", "api_key_env", "expected"),
    [
        pytest.param("other", KEY_ENV, "CERTIFICATE_VERIFY_FAILED", id="wrong-ca"),
        pytest.param("right", "", "HTTP 401", id="no-key"),
    ],
)
def test_a_refused_connection_says_why_and_what_to_set(ca, api_key_env, expected, key, tls):
    async def scenario():
        trainer = TestTrainer(
            TrainerSettings(port=0, script=("stop",), api_key_env=KEY_ENV, tls_cert=str(tls.server_pem))
        )
        port = await trainer.start()
        failures: list[ConnectFailed] = []

        def on_event(event):
            if isinstance(event, ConnectFailed):
                failures.append(event)
                client.stop()

        settings = ClientSettings(
            uri=f"wss://localhost:{port}",
            api_key_env=api_key_env,
            ca_file=str(tls.ca_pem if ca == "right" else tls.other_ca_pem),
        )
        client = TrainerClient(settings, on_event)
        await asyncio.wait_for(client.run(), WAIT_S)
        with pytest.raises(asyncio.TimeoutError):
            await trainer.finished(0.2)  # no client ever got past the handshake: the script never ran
        return failures, trainer.report

    failures, report = asyncio.run(scenario())
    assert report.connections == 0
    assert expected in failures[0].detail, failures
    hint = "ca_file" if ca == "other" else "api_key_env"
    assert hint in failures[0].detail, failures


@pytest.mark.parametrize(
    ("uri", "key_set", "expected"),
    [
        ("ws://192.0.2.1:9", True, f"the API key from ${KEY_ENV} would be sent in clear text"),
        ("ws://192.0.2.1:9", False, "unauthenticated and unencrypted"),
        ("ws://127.0.0.1:9", True, None),
        ("wss://192.0.2.1:9", True, None),
    ],
)
def test_a_key_bound_for_plain_ws_to_another_host_is_warned_about_naming_its_variable(uri, key_set, expected, key):
    environ = {KEY_ENV: key} if key_set else {}
    warning = plain_link_warning(ClientSettings(uri=uri, api_key_env=KEY_ENV), environ)
    if expected is None:
        assert warning is None
    else:
        assert warning is not None and expected in warning and key not in warning


def test_the_client_warns_once_at_startup_about_a_key_over_plain_ws(key):
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

        settings = ClientSettings(
            uri="ws://192.0.2.1:9",
            api_key_env=KEY_ENV,
            reconnect_initial_s=0.01,
            reconnect_max_s=0.02,
            open_timeout_s=0.2,
        )
        client = TrainerClient(settings, on_event)
        await asyncio.wait_for(client.run(), WAIT_S)

    asyncio.run(scenario())
    assert len(failures) >= 3  # it kept trying ...
    assert len(notices) == 1 and f"${KEY_ENV}" in notices[0].text  # ... and warned once, naming the variable
    assert key not in notices[0].text


@pytest.mark.parametrize(
    ("ca", "api_key_env", "refusal"),
    [
        pytest.param("right", KEY_ENV, None, id="right-key-and-ca"),
        pytest.param("other", KEY_ENV, "CERTIFICATE_VERIFY_FAILED", id="wrong-ca"),
        pytest.param("right", "", "HTTP 401", id="no-key"),
    ],
)
def test_the_deploy_link_reaches_a_policy_server_with_its_key_over_wss_or_says_why_not(
    ca, api_key_env, refusal, key, tls
):
    async def scenario():
        server = TestPolicyServer(PolicyServerSettings(api_key_env=KEY_ENV, tls_cert=str(tls.server_pem)))
        port = await server.start()
        events: list = []
        done = asyncio.Event()

        def on_event(event) -> None:
            events.append(event)
            if isinstance(event, PolicyConnected):
                client.request(event.epoch, {"observation/state": np.asarray([3.0])})
            elif isinstance(event, (ChunkReceived, ConnectFailed)):
                done.set()

        settings = ClientSettings(
            uri=f"wss://localhost:{port}",
            api_key_env=api_key_env,
            ca_file=str(tls.ca_pem if ca == "right" else tls.other_ca_pem),
            reconnect_initial_s=0.05,
        )
        client = PolicyClient(settings, Expectation(), on_event)
        task = asyncio.ensure_future(client.run())
        try:
            await asyncio.wait_for(done.wait(), WAIT_S)
        finally:
            client.stop()
            await asyncio.wait_for(task, WAIT_S)
            await server.close()
        return events, server.seen

    events, seen = asyncio.run(scenario())
    if refusal is None:
        chunk = next(e for e in events if isinstance(e, ChunkReceived))
        assert chunk.chunk.actions.shape == (10, 4)
        assert seen.answers == 1
    else:
        failed = next(e for e in events if isinstance(e, ConnectFailed))
        assert refusal in failed.detail and ("ca_file" if ca == "other" else "api_key_env") in failed.detail
        assert seen.connections == 0 and seen.answers == 0  # nothing was served before the refusal


# -- every server, the next one too ------------------------------------------------------------

# Executables that listen but need an extra this suite does not install: where each is tested with a key.
LISTENERS_ELSEWHERE = {"plugrl_ros.tools.policy_server": "test_rllib_policy_server.py (the rllib extra)"}


def _help(module: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        executables.command(module, "--help"), capture_output=True, text=True, timeout=WAIT_S, check=False
    )


@pytest.mark.gym
@pytest.mark.rllib
def test_every_executable_that_listens_takes_the_key_and_tls_options_and_is_refused_without_a_key_here():
    """The promise spans the package: an executable whose --help offers --port listens, so it must offer the
    key and TLS options and be one of the servers the 401 test above starts (or, needing an extra, one tested
    where that extra is installed). A new server that misses the gate fails here. An executable whose extra
    is missing says how to install it; the CI stages with the extras run this test again and see its help."""
    tested = {module for module, _ in SERVERS.values()}
    listeners = set()
    for module in sorted(set(executables.EXECUTABLES.values())):
        done = _help(module)
        if done.returncode != 0:  # an extra is missing: it says so, and says how to install it
            assert "install" in done.stderr and "Traceback" not in done.stderr, (module, done.stdout, done.stderr)
            continue
        if "--port" not in done.stdout:
            continue
        listeners.add(module)
        assert "--api-key-env" in done.stdout and "--tls-cert" in done.stdout, (module, done.stdout)
        assert module in tested or module in LISTENERS_ELSEWHERE, f"{module} listens but no test checks its key"
    assert tested <= listeners  # the servers this file starts are found by the same rule


def test_every_policy_server_backend_serves_through_the_one_gated_server():
    """plugrl-policy-server's backends need extras this suite may not have: each must load a policy and hand it
    to the one server (serve/policy_server.py: the access options, serve_trainer with the access), never listen
    by itself."""
    from plugrl_ros.tools.policy_server import BACKENDS

    package = Path(executables.__file__).parent
    server = (package / "serve" / "policy_server.py").read_text()
    assert "add_access_options(" in server and "access=self.access" in server
    assert sorted(BACKENDS) == ["lerobot", "rllib", "sb3"]
    for _, _, module in BACKENDS.values():
        source = (package / Path(*module.split(".")[1:])).with_suffix(".py").read_text()
        assert "from plugrl_ros.serve.policy_server import" in source and "load_and_serve(" in source, module
        assert "serve_trainer" not in source and "websockets" not in source, module


def test_every_server_in_the_package_passes_its_access_to_the_one_gate():
    """The library's servers too (the RLlib runner, the Gymnasium vector env, ...): every call that starts one,
    found by reading the package, names its access; a new one that forgets fails here."""
    calls = []
    for path in sorted(Path(executables.__file__).parent.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                "serve_trainer",
                "BridgeServer",
            ):
                keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
                calls.append((path.name, keywords.get("access")))
    assert len(calls) >= 7, calls  # the demo and test trainers, the test policy server, the policy server, ...
    assert all(access not in (None, "None") for _, access in calls), calls


async def _flood(uri: str, attempts: int, headers: list[tuple[str, str]] | None) -> list[int]:
    """Open ``attempts`` connections one after another; the HTTP status of each handshake."""
    statuses = []
    for _ in range(attempts):
        try:
            ws = await connect(uri, additional_headers=headers, open_timeout=WAIT_S)
        except InvalidStatus as refused:
            statuses.append(refused.response.status_code)
        else:
            await ws.close()
            statuses.append(101)
    return statuses


def test_hundreds_of_refused_attempts_add_one_line_and_two_authorization_headers_are_a_401(key):
    """Every record the package's loggers (websockets' server side included) write at INFO and above is counted."""
    records = _Records()
    records.setLevel(logging.INFO)
    logger = logging.getLogger("plugrl_ros")
    level = logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)

    async def scenario() -> list[int]:
        server = TestPolicyServer(PolicyServerSettings(api_key_env=KEY_ENV))
        uri = f"ws://127.0.0.1:{await server.start()}"
        try:
            statuses = await _flood(uri, 500, None)
            statuses += await _flood(uri, 20, [("Authorization", f"Api-Key {key}"), ("Authorization", "Api-Key x")])
            statuses += await _flood(uri, 20, [("Authorization", "Bearer")])
            statuses += await _flood(uri, 1, [("Authorization", f"Api-Key {key}")])  # the right key still opens
        finally:
            await server.close()
        return statuses

    try:
        statuses = asyncio.run(scenario())
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    assert statuses[:-1] == [401] * 540 and statuses[-1] == 101, sorted(set(statuses))
    refusals = [text for text in records.texts if "refused a connection from 127.0.0.1" in text]
    assert len(refusals) == 1 and "no API key" in refusals[0], records.texts  # the rest held back for a minute
    # the server's start and stop, the refusal, and the one connection that opened: nothing per refused attempt
    assert len(records.texts) <= 10, records.texts
    assert not any("failed" in text or "500" in text for text in records.texts), records.texts


def test_a_key_with_whitespace_at_either_end_stops_a_server_and_a_bridge_at_startup(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "plugrl-key\n")
    module, args = SERVERS["test-policy-server"]
    done = subprocess.run(
        executables.command(module, "--port", "0", "--api-key-env", KEY_ENV, *args),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert done.returncode == 2 and "begins or ends with whitespace" in done.stderr, (done.stdout, done.stderr)
    assert "plugrl-key" not in done.stderr + done.stdout and "Traceback" not in done.stderr
    problem = ClientSettings(uri="ws://localhost:9", api_key_env=KEY_ENV).access_problem(os.environ)
    assert problem is not None and problem[0] == "api_key_env" and "whitespace" in problem[2]
    assert "plugrl-key" not in " ".join(problem)


# -- redirects: whoever answers at a link's URI cannot send the robot elsewhere ----------------------


@pytest.mark.parametrize("link", ["trainer", "policy"])
def test_a_link_refuses_a_redirect_to_another_server_and_never_sends_it_the_key(link, key):
    async def scenario():
        target = TestPolicyServer(PolicyServerSettings(api_key_env=KEY_ENV))
        target_port = await target.start()

        def redirect(connection, request):
            response = connection.respond(302, "moved\n")
            response.headers["Location"] = f"ws://localhost:{target_port}/"  # another host name: another origin
            return response

        from websockets.asyncio.server import serve

        async def never(ws):  # a handshake answered 302 never gets here
            raise AssertionError("served")

        redirector = await serve(never, "127.0.0.1", 0, process_request=redirect)
        port = redirector.sockets[0].getsockname()[1]
        failures: list[ConnectFailed] = []

        def on_event(event) -> None:
            if isinstance(event, ConnectFailed):
                failures.append(event)
                if len(failures) >= 2:
                    client.stop()

        settings = ClientSettings(
            uri=f"ws://127.0.0.1:{port}", api_key_env=KEY_ENV, reconnect_initial_s=0.05, reconnect_max_s=0.1
        )
        if link == "trainer":
            client = TrainerClient(settings, on_event)
        else:
            client = PolicyClient(settings, Expectation(), on_event)
        try:
            await asyncio.wait_for(client.run(), WAIT_S)
        finally:
            redirector.close()
            await redirector.wait_closed()
            await target.close()
        return failures, target.seen

    failures, seen = asyncio.run(scenario())
    assert len(failures) >= 2  # refused every time, and kept trying the configured address
    assert "redirect" in failures[0].detail and "never follow" in failures[0].detail, failures[0]
    assert key not in failures[0].detail
    assert seen.authorization == [] and seen.connections == 0  # the target never saw the robot, nor its key
