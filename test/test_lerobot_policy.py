"""``plugrl-policy-server --lerobot``: LeRobot policies (ACT, Diffusion Policy) served to the bridge as openpi serves.

The policies are LeRobot's own classes, built small from their configs (untrained: what is tested is the serving,
not what they learnt) and saved as ``lerobot-train`` saves a checkpoint (``save_pretrained`` of the policy and of
its pre- and post-processor, with a dataset's stats). What the server answers is compared with LeRobot's own way of
acting: ``select_action`` after the same processors. The server runs as its own process behind the access gate,
and the bridge deploys it on the demo reachers (real processes).

Needs LeRobot itself (the lerobot-policy extra, ``lerobot==0.4.4``), so these skip in CI's venvs; the documented
LeRobot stage (``scripts/lerobot-check.sh``) runs them.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lerobot.policies.factory")

import torch
from harness import ROOT, ask_policy_server, process, python_module, serving_policy, stop
from websockets.exceptions import InvalidStatus

from plugrl_ros.lerobot_policy import policy_server
from plugrl_ros.serve.policy_server import parse

pytestmark = [pytest.mark.lerobot, pytest.mark.websockets, pytest.mark.slow]

CONFIGS = [str(ROOT / "config" / "demo.yaml"), str(ROOT / "config" / "demo_lerobot.yaml")]
SIZE = 32  # the demo camera's pixels a side (plugrl-demo-robot --image-size)
WAIT_S = 60.0


def tiny_policy(kind: str, folder: Path, action_dim: int = 2) -> Path:
    """A small untrained LeRobot policy of ``kind`` for the demo's features, saved as lerobot-train saves one."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import get_policy_class, make_policy_config, make_pre_post_processors

    inputs = {
        "observation.state": PolicyFeature(FeatureType.STATE, (8,)),
        "observation.images.camera": PolicyFeature(FeatureType.VISUAL, (3, SIZE, SIZE)),
    }
    outputs = {"action": PolicyFeature(FeatureType.ACTION, (action_dim,))}
    small = {
        "act": {"chunk_size": 10, "n_action_steps": 5, "dim_model": 32, "dim_feedforward": 64, "use_vae": False},
        "diffusion": {
            "crop_shape": None,
            "n_obs_steps": 2,
            "horizon": 8,
            "n_action_steps": 4,
            "down_dims": (32, 64),
            "num_inference_steps": 3,
            "diffusion_step_embed_dim": 16,
            "spatial_softmax_num_keypoints": 8,
        },
    }[kind]
    config = make_policy_config(
        kind, input_features=inputs, output_features=outputs, device="cpu", pretrained_backbone_weights=None, **small
    )
    torch.manual_seed(0)
    policy = get_policy_class(kind)(config)
    image = {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.2)}
    stats = {
        "observation.state": {"mean": torch.linspace(-0.5, 0.5, 8), "std": torch.full((8,), 0.7)},
        "observation.images.camera": {**image, "min": torch.zeros((3, 1, 1)), "max": torch.ones((3, 1, 1))},
        "action": {"mean": torch.full((action_dim,), 0.3), "std": torch.full((action_dim,), 1.5)},
    }
    for values in stats.values():
        values.setdefault("min", values["mean"] - 3 * values["std"])
        values.setdefault("max", values["mean"] + 3 * values["std"])
    pre, post = make_pre_post_processors(config, dataset_stats=stats)
    for part in (policy, pre, post):
        part.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def act(tmp_path_factory) -> Path:
    return tiny_policy("act", tmp_path_factory.mktemp("act"))


@pytest.fixture(scope="module")
def diffusion(tmp_path_factory) -> Path:
    return tiny_policy("diffusion", tmp_path_factory.mktemp("diffusion"))


def request(seed: int) -> dict[str, np.ndarray]:
    """One robot's observation as the bridge sends it with the demo's files."""
    rng = np.random.default_rng(seed)
    return {
        "state/joints": rng.normal(size=4),
        "state/target": rng.normal(size=4),
        "image/camera": rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8),
    }


def lerobots_own(folder: Path, requests: list[dict], steps: int, seed: int = 0) -> np.ndarray:
    """LeRobot's own acting on ``requests``: the features as its datasets give them, its processors, and
    ``select_action`` ``steps`` times per request, from a reset policy (torch seeded with ``seed`` once loaded)."""
    policy, pre, post = policy_server.load_policy(folder)
    policy.reset()
    torch.manual_seed(seed)
    actions = []
    for one in requests:
        state = np.concatenate([one["state/joints"], one["state/target"]]).astype(np.float32)  # name order
        image = torch.from_numpy(one["image/camera"]).permute(2, 0, 1).float() / 255
        batch = {"observation.state": torch.from_numpy(state)[None], "observation.images.camera": image[None]}
        with torch.inference_mode():
            actions.append([post(policy.select_action(pre(batch))).numpy()[0] for _ in range(steps)])
    return np.asarray(actions, dtype=np.float32)


def served(folder: Path, *extra: str):
    return policy_server.load(parse(["--lerobot", str(folder), "--config", *CONFIGS, *extra]))


def test_acts_chunk_is_lerobots_own_select_action_over_the_chunk(act):
    loaded = served(act)
    assert (loaded.horizon, loaded.action_dim) == (5, 2)  # the policy's n_action_steps and action width
    assert loaded.policy.startswith("LeRobot ") and loaded.policy.endswith(" act") and loaded.connect is None
    for seed in range(3):
        chunk = loaded.act(request(seed))
        assert chunk.shape == (5, 2) and chunk.dtype == np.float32
        np.testing.assert_allclose(chunk, lerobots_own(act, [request(seed)], 5)[0], rtol=1e-5, atol=1e-6)
    # --horizon takes fewer of the chunk's steps, never more than the policy predicts (chunk_size 10)
    np.testing.assert_allclose(served(act, "--horizon", "2").act(request(0)), loaded.act(request(0))[:2], atol=1e-6)
    with pytest.raises(policy_server.PolicyError, match="predicts 10 steps"):
        served(act, "--horizon", "11")


def test_diffusion_keeps_each_connections_history_as_its_select_action_does(diffusion):
    loaded = served(diffusion)
    assert (loaded.horizon, loaded.action_dim) == (4, 2) and loaded.connect is not None
    first, second = loaded.connect(), loaded.connect()
    torch.manual_seed(7)
    first(request(0))  # the first connection has seen request 0
    torch.manual_seed(8)
    after = first(request(1))  # ... and stacks it with request 1
    torch.manual_seed(8)
    fresh = second(request(1))  # the second has seen request 1 only: its history is its own
    own = lerobots_own(diffusion, [request(0)], 4, seed=7)[0]
    own_after = lerobots_own(diffusion, [request(1)], 4, seed=8)[0]
    torch.manual_seed(7)
    np.testing.assert_allclose(loaded.connect()(request(0)), own, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fresh, own_after, rtol=1e-4, atol=1e-5)
    assert not np.allclose(after, fresh, atol=1e-3)  # request 0 in its history changed the first's answer


def test_the_server_process_behind_a_key_refuses_keyless_and_answers_the_chunk(act):
    key = "plugrl-lerobot-key-0123456789abcdef"
    command = python_module(
        "plugrl_ros.tools.policy_server", "--lerobot", str(act), "--config", *CONFIGS, "--port", "0",
        "--api-key-env", "PLUGRL_TEST_LEROBOT_KEY",
    )  # fmt: skip
    proc, uri = serving_policy(command, {**os.environ, "PLUGRL_TEST_LEROBOT_KEY": key})
    try:
        with pytest.raises(InvalidStatus) as refused:
            asyncio.run(ask_policy_server(uri, request(0)))
        assert refused.value.response.status_code == 401
        metadata, answer = asyncio.run(ask_policy_server(uri, request(1), {"Authorization": f"Api-Key {key}"}))
    finally:
        stop(proc)
    assert metadata["action_horizon"] == 5 and metadata["action_dim"] == 2 and metadata["checkpoint"] == str(act)
    assert answer["actions"].shape == (5, 2) and answer["actions"].dtype == np.float32
    np.testing.assert_allclose(answer["actions"], lerobots_own(act, [request(1)], 5)[0], rtol=1e-5, atol=1e-6)


def test_openpis_own_client_gets_the_metadata_and_the_chunk(act):
    openpi = pytest.importorskip("openpi_client.websocket_client_policy")
    command = python_module("plugrl_ros.tools.policy_server", "--lerobot", str(act), "--config", *CONFIGS)
    proc, uri = serving_policy([*command, "--port", "0"])
    try:
        client = openpi.WebsocketClientPolicy(host="127.0.0.1", port=int(uri.rsplit(":", 1)[1]))
        assert client.get_server_metadata()["action_horizon"] == 5
        assert client.infer(request(2))["actions"].shape == (5, 2)
        client._ws.close()  # openpi's client has no close of its own
    finally:
        stop(proc)


def test_a_policy_of_another_robot_or_no_policy_is_refused_at_startup_saying_why(act, tmp_path):
    three = tiny_policy("act", tmp_path / "three", action_dim=3)
    for folder, config, expected in (
        (three, CONFIGS, "the policy's actions are 3 wide"),
        (tmp_path / "nothing", CONFIGS, "no config.json"),
        (act, CONFIGS[:1], "sends no key with images.camera"),  # demo.yaml alone sends no image
    ):
        done = subprocess.run(
            python_module("plugrl_ros.tools.policy_server", "--lerobot", str(folder), "--config", *config),
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stderr and expected in done.stderr, done.stderr


@pytest.mark.ros
@pytest.mark.timeout(240)
def test_the_bridge_deploys_a_lerobot_policy_on_the_demo_reachers(act):
    server, uri = serving_policy(
        python_module("plugrl_ros.tools.policy_server", "--lerobot", str(act), "--config", *CONFIGS, "--port", "0")
    )
    robot = python_module("plugrl_ros.demo.robot_node", "--envs", "2", "--mode", "timer", "--image-size", str(SIZE))
    bridge = python_module(
        "plugrl_ros.node.bridge_main",
        *("--ros-args", "--params-file", CONFIGS[0], "--params-file", CONFIGS[1]),
        *(
            "-p",
            "mode:=deploy",
            "-p",
            "control.mode:=timer",
            "-p",
            f"policy.uri:={uri.replace('localhost', '127.0.0.1')}",
        ),
    )
    try:
        with process(robot), process(bridge) as bridged:
            time.sleep(20.0)  # two reachers at 20 Hz, a chunk of 5 steps each: about 160 answers
            assert bridged.stop(30) == 0, bridged.output()[-3000:]
    finally:
        stop(server)
        output = server.stdout.read() if server.stdout else ""
    answers = [int(n) for n in re.findall(r"stopped: (\d+) answers, 0 failed requests", output)]
    assert answers and answers[0] >= 40, output[-3000:]
