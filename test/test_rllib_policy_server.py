"""plugrl-policy-server --rllib: an RLlib checkpoint's policy, served as openpi serves one, checked against the runner.

The checkpoint is the demo's PPO (config/demo.yaml's reachers, H = 1, a
MeanStdFilter whose statistics have seen observations), saved with RLlib's
``save_to_path``. The server is the real executable; clients are openpi's own
(when installed) and the bridge's policy-session rules over real websockets.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from harness import ROOT, process, python_module, wait_until

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.policy.session import Chunk, Expectation, PolicySession

pytestmark = [pytest.mark.rllib, pytest.mark.ros, pytest.mark.websockets, pytest.mark.slow]

DEMO = ROOT / "config" / "demo.yaml"
WAIT_S = 60.0  # a hang guard: the server imports torch and Ray and loads the checkpoint within this


def observations(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Requests as the demo's deploy-mode bridge sends them (config/demo.yaml's policy.observations)."""
    rng = np.random.default_rng(seed)
    return [
        {"state/joints": rng.normal(0.0, 1.5, 4), "state/target": rng.normal(0.0, 0.5, 4), "prompt": "reach"}
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Iterator[tuple[Path, list[np.ndarray]]]:
    """A checkpoint of the demo's PPO whose filter has seen observations, and the runner's own actions for
    :func:`observations` (seed 1) without exploration, with the connector state the checkpoint holds."""
    from ray.rllib.core import COMPONENT_ENV_TO_MODULE_CONNECTOR
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from plugrl_ros.rllib.demo import demo_config

    algo = demo_config(DEMO, port=0).build_algo()
    try:
        runner = algo.env_runner

        def episode(request: dict) -> SingleAgentEpisode:
            made = SingleAgentEpisode(observation_space=runner.observation_space, action_space=runner.action_space)
            observation = {"states": {"joints": request["state/joints"], "target": request["state/target"]}}
            made.add_env_reset({g: {k: v.astype(np.float32) for k, v in d.items()} for g, d in observation.items()})
            return made

        # the filter learns these observations' statistics, as it does from a robot's (the runner's own pass)
        for request in observations(50, seed=0):
            runner._policy.prepare([episode(request)], explore=True)
        path = Path(tmp_path_factory.mktemp("rllib") / "checkpoint")
        algo.save_to_path(path)
        saved = runner.get_state(components=COMPONENT_ENV_TO_MODULE_CONNECTOR)
        expected = []
        for request in observations(8, seed=1):
            runner.set_state(saved)  # deployed, the filter does not learn: each action from the saved statistics
            (decision,) = runner._policy.decide(
                runner._policy.prepare([episode(request)], explore=False), False, 0, False
            )
            expected.append(np.asarray(decision.action_for_env, dtype=np.float32).reshape(1, -1))
    finally:
        algo.stop()
    yield path, expected


@pytest.fixture(scope="module")
def server(checkpoint) -> Iterator[int]:
    path, _ = checkpoint
    command = python_module("plugrl_ros.rllib.policy_server", "--rllib", str(path), "--config", str(DEMO))
    with process([*command, "--port", "0"]) as served:
        line = listening_line(served)
        assert line.startswith("listening on"), line
        yield int(line.rsplit(":", 1)[1])
    assert served.proc.returncode == 0, served.output()  # SIGINT: an orderly stop


def listening_line(served) -> str:
    """The server's ``listening on ...`` line, once it prints it (or what it said if it exited first)."""
    return wait_until(
        lambda: (
            next((x for x in served.output().splitlines() if x.startswith("listening on")), None)
            or (served.proc.poll() is not None and f"exited: {served.output()}")
        ),
        WAIT_S,
        "the policy server listening",
    )


def ask(port: int, requests: list[dict]) -> tuple[dict, list[Chunk]]:
    """The server's metadata and answers, under the bridge's own rules for an openpi server."""
    from websockets.sync.client import connect

    session = PolicySession(Expectation(min_width=2))
    with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None, open_timeout=WAIT_S) as ws:
        metadata = session.receive(ws.recv(WAIT_S))
        chunks = []
        for request in requests:
            ws.send(session.request(request))
            chunk = session.receive(ws.recv(WAIT_S))
            assert isinstance(chunk, Chunk)
            chunks.append(chunk)
    return metadata.raw, chunks


def test_the_server_acts_as_the_runner_does_without_exploration_on_the_same_observations(checkpoint, server):
    _, expected = checkpoint
    metadata, chunks = ask(server, observations(8, seed=1))
    assert metadata["action_horizon"] == 1 and metadata["action_dim"] == 2
    assert all(chunk.actions.shape == (1, 2) for chunk in chunks)
    actual = np.stack([chunk.actions for chunk in chunks])
    assert np.allclose(actual, np.stack(expected), atol=1e-6), (actual, expected)
    assert len({tuple(a.ravel()) for a in actual}) == len(actual)  # each observation its own action
    # nothing learned while deployed: the same observation, the same action, now and after other requests
    _, again = ask(server, observations(8, seed=1)[:1])
    assert np.array_equal(again[0].actions, chunks[0].actions)


def test_openpis_own_client_gets_the_metadata_and_a_chunk_of_h_by_action_dim(checkpoint, server):
    openpi = pytest.importorskip("openpi_client.websocket_client_policy")
    _, expected = checkpoint
    client = openpi.WebsocketClientPolicy(host="127.0.0.1", port=server)
    metadata = client.get_server_metadata()
    assert metadata["action_horizon"] == 1 and metadata["action_dim"] == 2
    answer = client.infer(observations(1, seed=1)[0])
    assert answer["actions"].shape == (1, 2) and answer["actions"].dtype == np.float32
    assert np.allclose(answer["actions"], expected[0], atol=1e-6)
    assert "infer_ms" in answer["server_timing"]
    client._ws.close()  # openpi's client has no close of its own


def test_a_request_without_a_key_the_policy_reads_is_answered_with_its_traceback_and_1011(server):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{server}", compression=None, max_size=None, open_timeout=WAIT_S) as ws:
        ws.recv(WAIT_S)  # metadata
        ws.send(codec.packb({"state/joints": np.zeros(4)}))
        text = ws.recv(WAIT_S)
        assert isinstance(text, str) and "state/target" in text and "is missing from the request" in text
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(WAIT_S)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
    _, chunks = ask(server, observations(1, seed=2))  # the server serves on
    assert chunks[0].actions.shape == (1, 2)


def refusal(*args: str) -> str:
    """What the executable says when it refuses to serve (it must exit 2)."""
    command = python_module("plugrl_ros.rllib.policy_server", *args, "--port", "0")
    done = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    return done.stderr


def test_a_folder_that_is_not_an_rllib_checkpoint_is_refused_saying_what_is_expected(tmp_path: Path):
    (tmp_path / "weights.pt").write_bytes(b"not a checkpoint")
    said = refusal("--rllib", str(tmp_path), "--config", str(DEMO))
    assert "not an RLlib checkpoint" in said and "rllib_checkpoint.json" in said and "save_to_path" in said


def test_a_part_of_a_checkpoint_is_refused_as_not_an_algorithm_checkpoint(checkpoint):
    from plugrl_ros.rllib.checkpoint_policy import CheckpointError, checkpoint_parts

    path, _ = checkpoint
    with pytest.raises(CheckpointError, match="an RLlib checkpoint of a part"):
        checkpoint_parts(path / "learner_group")


def test_a_checkpoint_given_by_a_relative_path_loads(checkpoint, monkeypatch):
    """RLlib reads a relative path as a URI with no scheme, which pyarrow refuses: the server makes it absolute."""
    from plugrl_ros.rllib.checkpoint_policy import load_checkpoint_policy

    path, _ = checkpoint
    monkeypatch.chdir(path.parent)
    policy = load_checkpoint_policy(path.name)
    assert policy.parts.root == path.absolute()


def _config_with(tmp_path: Path, old: str, new: str) -> Path:
    text = DEMO.read_text()
    assert old in text
    changed = tmp_path / "robot.yaml"
    changed.write_text(text.replace(old, new))
    return changed


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        # another robot's joint state: 2 values where the checkpoint reads 4
        ("fields: [position, velocity]", "fields: [position]", "observations.states.joints"),
        # other speed limits than the policy was trained to command
        ("max: [2.0, 2.0]", "max: [1.0, 1.0]", "sinks clip each step"),
        # the request sends the target under no key
        ('          target: states.target       # "state/target"\n', "", "sends no key with states.target"),
    ],
)
def test_a_params_file_of_another_robot_is_refused_naming_what_differs(checkpoint, tmp_path, old, new, named):
    from plugrl_ros.rllib.checkpoint_policy import load_checkpoint_policy
    from plugrl_ros.serve.request_reader import ConfigMismatch, RequestReader

    path, _ = checkpoint
    policy = load_checkpoint_policy(path)
    with pytest.raises(ConfigMismatch) as refused:
        RequestReader.from_params_file(_config_with(tmp_path, old, new), policy.observation_space, policy.action_space)
    assert named in str(refused.value)


def test_the_executable_refuses_a_params_file_of_another_robot(checkpoint, tmp_path: Path):
    path, _ = checkpoint
    changed = _config_with(tmp_path, "fields: [position, velocity]", "fields: [position]")
    said = refusal("--rllib", str(path), "--config", str(changed))
    assert "does not describe the robot the checkpoint was trained for" in said
    assert "observations.states.joints" in said


def test_the_request_reader_reads_the_text_where_the_params_files_send_one(checkpoint, tmp_path: Path):
    """A language policy's task: the key a second params file maps to the text source (files read in order)."""
    from plugrl_ros.rllib.checkpoint_policy import load_checkpoint_policy
    from plugrl_ros.serve.request_reader import RequestReader

    path, _ = checkpoint
    policy = load_checkpoint_policy(path)
    overlay = tmp_path / "prompt.yaml"
    overlay.write_text("/**:\n  ros__parameters:\n    policy:\n      observations:\n        prompt: text\n")
    spaces = (policy.observation_space, policy.action_space)
    reader = RequestReader.from_params_file([DEMO, overlay], *spaces)
    assert reader.text({"prompt": "reach the target"}) == "reach the target" and reader.text({}) == ""
    assert RequestReader.from_params_file(DEMO, *spaces).text({"prompt": "reach the target"}) is None


def test_the_horizon_given_must_fit_the_checkpoints_actions(checkpoint):
    from plugrl_ros.rllib.checkpoint_policy import load_checkpoint_policy
    from plugrl_ros.serve.request_reader import ConfigMismatch, RequestReader

    path, _ = checkpoint
    policy = load_checkpoint_policy(path)
    with pytest.raises(ConfigMismatch, match="actuators read 2 values per step"):
        RequestReader.from_params_file(DEMO, policy.observation_space, policy.action_space, horizon=2)


def test_the_server_is_registered_as_an_executable():
    from plugrl_ros import executables

    assert executables.EXECUTABLES["plugrl-policy-server"] == "plugrl_ros.tools.policy_server"
    shown = subprocess.run(
        python_module("plugrl_ros.tools.policy_server", "--help"),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=True,
    ).stdout
    assert "--rllib" in shown and "--config" in shown and "--horizon" in shown


def test_with_a_key_set_a_keyless_or_wrong_handshake_is_refused_with_401_and_the_key_is_served_over_wss(
    checkpoint, tmp_path: Path
):
    """plugrl-policy-server stands behind the same gate as every server the package ships (test_server_auth.py
    finds every listening executable; this one needs the rllib extra)."""
    import asyncio
    import os
    import secrets
    import ssl

    import trustme
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    ca = trustme.CA()
    ca.issue_cert("localhost", "127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    key = "plugrl-" + secrets.token_hex(16)
    path, _ = checkpoint
    command = python_module(
        "plugrl_ros.rllib.policy_server", "--rllib", str(path), "--config", str(DEMO), "--port", "0",
        "--api-key-env", "PLUGRL_TEST_POLICY_KEY", "--tls-cert", str(tmp_path / "server.pem"),
    )  # fmt: skip
    with process(command, env={**os.environ, "PLUGRL_TEST_POLICY_KEY": key}) as served:
        line = listening_line(served)
        assert line.startswith("listening on wss://"), line
        uri = f"wss://localhost:{line.rsplit(':', 1)[1]}"
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))

        async def statuses() -> tuple[list[int], dict]:
            refused = []
            for headers in (None, [("Authorization", f"Api-Key not-{key}")]):
                with pytest.raises(InvalidStatus) as answer:
                    await connect(uri, ssl=context, additional_headers=headers, open_timeout=WAIT_S)
                refused.append(answer.value.response.status_code)
            headers = [("Authorization", f"Api-Key {key}")]
            async with connect(uri, ssl=context, additional_headers=headers, max_size=None) as ws:
                metadata = codec.unpackb(await asyncio.wait_for(ws.recv(), WAIT_S))
            return refused, metadata

        refused, metadata = asyncio.run(statuses())
    assert refused == [401, 401]
    assert metadata["action_dim"] == 2 and metadata["action_horizon"] == 1, metadata
    output = served.output()
    assert "PLUGRL_TEST_POLICY_KEY" in output and key not in output
    assert "refused a connection from 127.0.0.1" in output and "no API key required" not in output
