"""Stable-Baselines3 trains the demo reachers through real bridges, its model is served by plugrl-policy-server --sb3,
and plugrl-demo --trainer sb3 runs to its deploy step.

Real processes throughout: the demo robot node, bridges configured by the shipped config/demo.yaml, the policy
server as its own process; the SB3 model trains in this process on RobotVecEnv.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from harness import ROOT, ask_policy_server, process, python_module, serving_policy, stop
from websockets.exceptions import InvalidStatus

from plugrl_ros.protocol.server_auth import ServerAccess
from plugrl_ros.sb3 import RobotVecEnv
from plugrl_ros.vector import VectorSettings

pytestmark = [pytest.mark.sb3, pytest.mark.ros, pytest.mark.websockets, pytest.mark.slow]

DEMO = ROOT / "config" / "demo.yaml"
WAIT_S = 60.0


def robot(envs: int) -> list[str]:
    return python_module("plugrl_ros.demo.robot_node", "--envs", str(envs), "--image-size", "16")


def bridge(port: int, envs: list[str]) -> list[str]:
    return python_module(
        "plugrl_ros.node.bridge_main",
        *("--ros-args", "--params-file", str(DEMO)),
        *("-p", f"trainer.uri:=ws://127.0.0.1:{port}", "-p", f"envs:={envs!r}", "-p", "status.log_period_s:=0.0"),
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[dict], list[float]]:
    """SAC trained for 600 steps of two reachers: the saved model, SB3's episode infos, evaluate_policy's returns."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.evaluation import evaluate_policy

    path = tmp_path_factory.mktemp("sb3") / "sac.zip"
    settings = VectorSettings(port=0, access=ServerAccess(api_key_env=""), algorithm="SB3 SAC")
    env = RobotVecEnv.from_params(DEMO, 2, settings, images=[], state_dims={"target": 4})
    with process(robot(2)), process(bridge(env.port, ["reacher0", "reacher1"])):
        try:
            model = SAC("MultiInputPolicy", env, learning_starts=200, seed=0, device="cpu", gamma=0.9)
            model.learn(1200)  # SB3's timesteps: 600 steps of the two robots
            model.save(path)
            episodes = list(model.ep_info_buffer)
            returns, _ = evaluate_policy(model, env, n_eval_episodes=2, return_episode_rewards=True)
        finally:
            env.close()  # the bridge's run ends (plugrl-server-stop)
    return path, episodes, returns


def test_sac_trains_on_the_robots_and_sb3_sees_their_episodes(trained):
    path, episodes, returns = trained
    assert path.is_file()
    # SB3's logger reads what the bridge counted: 600 steps of two robots end about 20 episodes of at most 60 steps
    assert len(episodes) >= 15 and all(0 < e["l"] <= 60 and e["r"] < 0 for e in episodes), episodes
    assert len(returns) == 2 and all(r < 0 for r in returns)  # evaluate_policy, as on a Monitor-wrapped env


def test_the_policy_server_answers_with_the_models_deterministic_action(trained):
    from stable_baselines3 import SAC

    path, _, _ = trained
    command = python_module("plugrl_ros.tools.policy_server", "--sb3", str(path), "--config", str(DEMO), "--port", "0")
    proc, uri = serving_policy(command)
    try:
        joints, target = np.array([0.1, -0.2, 0.0, 0.3]), np.array([0.05, 0.02, 0.1, -0.1])
        metadata, answer = asyncio.run(ask_policy_server(uri, {"state/joints": joints, "state/target": target}))
    finally:
        stop(proc)
    assert metadata["action_horizon"] == 1 and metadata["action_dim"] == 2
    assert metadata["policy"].startswith("Stable-Baselines3 ") and "SAC (deterministic)" in metadata["policy"]
    expected, _ = SAC.load(path, device="cpu").predict(
        {"joints": joints.astype(np.float32), "target": target.astype(np.float32)}, deterministic=True
    )
    assert answer["actions"].shape == (1, 2) and answer["actions"].dtype == np.float32
    np.testing.assert_allclose(answer["actions"][0], expected, rtol=1e-6, atol=1e-6)


def test_with_a_key_set_the_sb3_server_refuses_a_keyless_handshake_with_401(trained, monkeypatch):
    path, _, _ = trained
    key = "plugrl-sb3-key-0123456789abcdef"
    command = python_module(
        "plugrl_ros.tools.policy_server", "--sb3", str(path), "--config", str(DEMO), "--port", "0",
        "--api-key-env", "PLUGRL_TEST_SB3_KEY",
    )  # fmt: skip
    proc, uri = serving_policy(command, {**os.environ, "PLUGRL_TEST_SB3_KEY": key})
    try:
        with pytest.raises(InvalidStatus) as refused:
            asyncio.run(ask_policy_server(uri, {}))
        assert refused.value.response.status_code == 401
        request = {"state/joints": np.zeros(4), "state/target": np.zeros(4)}
        _, answer = asyncio.run(ask_policy_server(uri, request, {"Authorization": f"Api-Key {key}"}))
        assert answer["actions"].shape == (1, 2)
    finally:
        stop(proc)


def test_a_model_the_params_file_does_not_describe_is_refused_at_startup_naming_the_key(trained, tmp_path):
    path, _, _ = trained
    other = tmp_path / "other.yaml"
    text = DEMO.read_text()
    assert "        target:" in text
    other.write_text(text.replace("        target:", "        goal:").replace("states.target", "states.goal"))
    for config, expected in ((other, "'target'"), (DEMO, None)):
        args = ("--sb3", str(tmp_path / "missing.zip") if expected is None else str(path), "--config", str(config))
        done = subprocess.run(
            python_module("plugrl_ros.tools.policy_server", *args, "--port", "0"),
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        assert (expected or "no such file") in done.stderr, done.stderr


@pytest.mark.timeout(300)
def test_plugrl_demo_with_sb3_ppo_runs_to_the_end_and_deploys_its_model(tmp_path: Path):
    output = tmp_path / "demo"
    command = [sys.executable, "-m", "plugrl_ros.demo.runner", "--trainer", "sb3", "--algorithm", "PPO"]
    command += ["--duration", "40", "--deploy-duration", "12", "--no-record", "--output", str(output)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        out, _ = proc.communicate(timeout=280)
    finally:
        stop(proc)
    assert proc.returncode == 0, out
    summary = json.loads((output / "summary.json").read_text())
    assert summary["ok"] and summary["bridge_exit_code"] == 0, summary
    assert summary["episodes"] >= 10 and not summary["trainer_reconnects"], summary
    deploy = summary["deploy"]
    assert deploy["policy_server"] == "plugrl-policy-server --sb3" and deploy["episodes"] >= 2, deploy
    assert deploy["bridge_exit_code"] == 0 and deploy["policy_server_exit_code"] == 0, deploy
    assert (output / "sb3_model.zip").is_file() and "Stable-Baselines3 model" in out
    log = (output / "logs" / "trainer.log").read_text()
    assert re.search(r"robots idle \d+ % of their time", log), log[-2000:]  # what the robots waited for SB3


@pytest.mark.gym
@pytest.mark.timeout(400)
def test_the_benchmarks_smoke_run_gives_the_very_same_episodes_and_weights_as_sb3_on_the_env(tmp_path: Path):
    """bench_sb3.py --quick: SB3's PPO and SAC through plugrl-gym-robot and the bridge, against SB3 on the env."""
    pytest.importorskip("mujoco")
    results = tmp_path / "bench.json"
    command = [sys.executable, str(ROOT / "bench" / "bench_sb3.py"), "--quick", "--seeds", "1", "--json", str(results)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=380,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    cases = {r["case"]: r for r in json.loads(results.read_text())["results"]}
    assert sorted(cases) == ["ppo", "sac"]
    for case in cases.values():
        (row,) = case["seeds"]
        assert row["identical_episodes"] and row["identical_weights"], row
        assert row["episodes"][0] == row["episodes"][1] >= 2, row
