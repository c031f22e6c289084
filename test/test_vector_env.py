"""The Gymnasium vector env trains the demo reachers through real bridges: same-step autoreset, the bridge's
episode counts, robots that leave, come back, never come or are too many, a trainer that pauses, the key.

Real processes throughout: the demo robot node and bridges configured by the shipped config/demo.yaml;
the vector env runs in this process (it is a library).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import numpy as np
import pytest

pytest.importorskip("gymnasium")

import gymnasium as gym
from gymnasium.vector import AutoresetMode
from harness import ROOT, process, python_module, wait_until
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from plugrl_ros.protocol.server_auth import ServerAccess
from plugrl_ros.vector import RobotsMissing, RobotVectorEnv, VectorSettings

pytestmark = [pytest.mark.gym, pytest.mark.ros, pytest.mark.websockets]

DEMO = ROOT / "config" / "demo.yaml"


def robot(envs: int, *extra: str) -> list[str]:
    return python_module("plugrl_ros.demo.robot_node", "--envs", str(envs), "--image-size", "16", *extra)


def bridge(name: str, port: int, envs: list[str], *params: str) -> list[str]:
    settings = [f"trainer.uri:=ws://127.0.0.1:{port}", f"envs:={envs!r}", "trainer.reconnect_max_s:=0.5"]
    settings += ["status.log_period_s:=0.0", *params]
    return python_module(
        "plugrl_ros.node.bridge_main",
        *("--ros-args", "-r", f"__node:={name}", "--params-file", str(DEMO)),
        *(arg for setting in settings for arg in ("-p", setting)),
    )


@contextmanager
def vector_env(n: int, autoreset_mode=AutoresetMode.NEXT_STEP, **settings) -> Iterator[RobotVectorEnv]:
    settings.setdefault("access", ServerAccess(api_key_env=""))
    env = RobotVectorEnv.from_params(
        DEMO, n, VectorSettings(port=0, **settings), images=[], state_dims={"target": 4}, autoreset_mode=autoreset_mode
    )
    try:
        yield env
    finally:
        env.close()


def test_two_robots_on_one_bridge_with_gymnasiums_own_wrappers_and_next_step_autoreset():
    """Gymnasium's default rule, and its own vector wrappers unchanged: its episode statistics are the bridge's."""
    with vector_env(2) as env, process(robot(2)), process(bridge("bridge_v", env.port, ["reacher0", "reacher1"])):
        wrapped = gym.wrappers.vector.FlattenObservation(env)
        wrapped = gym.wrappers.vector.NormalizeObservation(gym.wrappers.vector.ClipAction(wrapped))
        wrapped = gym.wrappers.vector.RecordEpisodeStatistics(wrapped)
        assert wrapped.single_observation_space.shape == (8,)
        obs, infos = wrapped.reset(seed=0)
        assert obs.shape == (2, 8) and infos["bridge"].tolist() == [0, 0]
        done, resets, ended = np.zeros(2, bool), 0, 0
        for _ in range(400):
            obs, rewards, terminated, truncated, infos = wrapped.step(wrapped.action_space.sample() * 2.0)
            assert infos["robot"].tolist() == [0, 1] and (infos["wait_s"] >= 0).all()
            for i in np.flatnonzero(done):  # the reset step: the action was ignored, the next episode begins
                assert rewards[i] == 0.0 and not terminated[i] and not truncated[i]
                resets += 1
            for i in np.flatnonzero(terminated | truncated):
                # Gymnasium's own count of the episode is the bridge's, to float32 rounding of the rewards
                ours, theirs = infos["robot_episode"], infos["episode"]
                assert infos["_robot_episode"][i] and infos["_episode"][i]
                assert theirs["l"][i] == ours["l"][i] and bool(truncated[i]) == (ours["l"][i] == 60)
                assert theirs["r"][i] == pytest.approx(ours["r"][i], rel=1e-5, abs=1e-5)
                ended += 1
            done = terminated | truncated
        assert "lost" not in infos and "final_obs" not in infos
    assert ended >= 12 and resets >= ended - 2, (ended, resets)


def test_same_step_autoreset_returns_the_next_episodes_first_observation_with_the_last_as_final_obs():
    with (
        vector_env(2, AutoresetMode.SAME_STEP) as env,
        process(robot(2)),
        process(bridge("bridge_s", env.port, ["reacher0", "reacher1"])),
    ):
        assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
        env.reset(seed=0)
        returns, lengths, ended = np.zeros(2), np.zeros(2, int), 0
        for _ in range(400):
            obs, rewards, terminated, truncated, infos = env.step(env.action_space.sample())
            returns += rewards
            lengths += 1
            for i in np.flatnonzero(terminated | truncated):
                assert infos["robot_episode"]["l"][i] == lengths[i]
                assert infos["robot_episode"]["r"][i] == pytest.approx(returns[i], rel=1e-5, abs=1e-5)
                final = infos["final_obs"][i]
                assert infos["_final_obs"][i] and not np.array_equal(final["target"], obs["target"][i])
                returns[i], lengths[i] = 0.0, 0
                ended += 1
    assert ended >= 12


def test_with_chunks_each_step_is_a_whole_chunk_of_h_control_steps():
    env = RobotVectorEnv.from_params(
        DEMO, 2, VectorSettings(port=0, access=ServerAccess(api_key_env="")), horizon=5, images=[],
        state_dims={"target": 4},
    )  # fmt: skip
    try:
        with process(robot(2)), process(bridge("bridge_h", env.port, ["reacher0", "reacher1"])):
            assert env.single_action_space.shape == (10,)  # five steps of two joint velocities, time-major
            env.reset()
            steps, lengths = np.zeros(2, int), []
            for _ in range(60):
                _, _, terminated, truncated, infos = env.step(env.action_space.sample())
                steps += 1
                for i in np.flatnonzero(terminated | truncated):
                    lengths.append((int(steps[i]), int(infos["robot_episode"]["l"][i]), bool(truncated[i])))
                    steps[i] = -1  # the next step is the reset step (next-step autoreset)
    finally:
        env.close()
    # a truncated episode is 60 control steps: 12 chunks of 5; an episode may end early only by reaching the target
    assert lengths and all(control == 60 and n == 12 for n, control, cut in lengths if cut), lengths
    assert all(n == -(-control // 5) for n, control, _ in lengths), lengths


def test_a_robot_that_never_connects_is_named_after_the_connect_timeout():
    with vector_env(3, connect_timeout_s=6.0) as env, process(robot(2)):
        with process(bridge("bridge_n", env.port, ["reacher0", "reacher1"])):
            started = time.monotonic()
            with pytest.raises(RobotsMissing) as missing:
                env.reset()
    assert time.monotonic() - started >= 5.9
    assert "slot(s) 2 have no robot" in str(missing.value), missing.value
    assert "(1 bridge(s) connected, 2 of 3 slots held)" in str(missing.value), missing.value


def test_a_bridge_that_leaves_truncates_its_robots_episode_and_a_waiting_bridge_takes_the_slot(caplog):
    caplog.set_level(logging.INFO, logger="plugrl_ros.vector")
    with vector_env(2, reconnect_timeout_s=30.0) as env, process(robot(3)), ExitStack() as bridges:
        a = bridges.enter_context(process(bridge("bridge_a", env.port, ["reacher0"])))
        wait_until(lambda: "slot 0: robot 0 of bridge 0" in caplog.text, 60, "bridge_a in slot 0")
        bridges.enter_context(process(bridge("bridge_b", env.port, ["reacher1"])))
        _, infos = env.reset()
        first = infos["bridge"].tolist()
        for _ in range(30):
            env.step(env.action_space.sample())
        # a third bridge finds both slots taken: refused, it keeps trying with its back-off
        c = bridges.enter_context(process(bridge("bridge_c", env.port, ["reacher2"])))
        refusal = "brings 1 more robot(s) but 0 of the 2 slots are free"
        wait_until(lambda: refusal in caplog.text, 30, "the refusal")
        for _ in range(20):
            env.step(env.action_space.sample())
        assert caplog.text.count(refusal) == 1  # it kept trying: one WARN a minute per host
        a.stop()  # bridge_a (slot 0) leaves, as on Ctrl-C, during the run
        lost = None
        for _ in range(200):  # bounded: each step waits at most for a reconnection
            _, _, terminated, truncated, infos = env.step(env.action_space.sample())
            if "lost" in infos and infos["lost"][0]:
                lost = (bool(terminated[0]), bool(truncated[0]))
                break
        assert lost == (False, True), caplog.text[-3000:]  # its episode truncated where its robot left
        # the next step is the slot's reset step: the first observation of bridge_c's robot
        _, rewards, _, _, infos = env.step(env.action_space.sample())
        taken = infos["bridge"][0]
        assert taken not in first and rewards[0] == 0.0, infos
        for _ in range(30):
            _, _, _, _, infos = env.step(env.action_space.sample())
        assert infos["bridge"][0] == taken and "lost" not in infos
        assert c.proc.poll() is None
    assert "slot 0: its robot" in caplog.text and "left mid-episode" in caplog.text


def test_robots_idle_while_the_trainer_pauses_and_the_idle_share_shows_it():
    """Timer mode: the robots run in real time; between two steps the trainer thinks for 1.5 s."""
    timer = ("control.mode:=timer",)
    with vector_env(2) as env, process(robot(2, "--mode", "timer")):
        with process(bridge("bridge_t", env.port, ["reacher0", "reacher1"], *timer)) as b:
            env.reset()
            for _ in range(20):
                env.step(env.action_space.sample())
            env.link_figures()  # a new window
            time.sleep(1.5)
            _, _, _, _, infos = env.step(env.action_space.sample())
            figures = env.link_figures()
            for _ in range(20):
                env.step(env.action_space.sample())
            assert b.proc.poll() is None and "connection 2" not in b.output()  # no reconnect: the robots waited
    assert (infos["wait_s"] >= 1.4).all(), infos["wait_s"]
    assert figures.robots == 2 and figures.idle_share is not None and figures.idle_share > 0.5, figures


def test_a_persons_corrections_reach_the_trainer_in_infos():
    """The demo's scripted person drives both reachers from the first moment (config/demo_intervention.yaml)."""
    person = python_module(
        "plugrl_ros.demo.teleop_node", "--minutes", "0", "--stray", "0", "--patience", "0", "--release", "0.01"
    )
    corrected = []
    with vector_env(2) as env, process(robot(2, "--mode", "timer")), process(person):
        settings = ("control.mode:=timer", "status.log_period_s:=0.0")
        command = python_module(
            "plugrl_ros.node.bridge_main",
            *(
                "--ros-args",
                "--params-file",
                str(DEMO),
                "--params-file",
                str(ROOT / "config" / "demo_intervention.yaml"),
            ),
            *(arg for setting in (f"trainer.uri:=ws://127.0.0.1:{env.port}", *settings) for arg in ("-p", setting)),
        )
        with process(command):
            env.reset()
            for _ in range(150):
                _, _, _, _, infos = env.step(np.zeros((2, 2), np.float32))  # the policy says: stand still
                if "intervention" in infos:
                    for i in np.flatnonzero(infos["intervention"]):
                        corrected.append(infos["intervention_action"][i])
    assert len(corrected) >= 20, len(corrected)
    executed = np.array(corrected)
    assert executed.shape[1] == 2 and np.isfinite(executed).all()
    assert (np.abs(executed).max(axis=1) > 0).mean() > 0.5  # the person moved the arm where the policy stood still


def test_with_a_key_set_the_vector_env_refuses_a_keyless_bridge_with_401(monkeypatch):
    monkeypatch.setenv("PLUGRL_TEST_VECTOR_KEY", "plugrl-vector-key-0123456789abcdef")
    with vector_env(1, access=ServerAccess(api_key_env="PLUGRL_TEST_VECTOR_KEY")) as env:

        async def attempt(headers) -> int:
            try:
                ws = await connect(f"ws://127.0.0.1:{env.port}", additional_headers=headers)
            except InvalidStatus as refused:
                return refused.response.status_code
            await ws.close()
            return 101

        assert asyncio.run(attempt(None)) == 401
        assert asyncio.run(attempt({"Authorization": "Api-Key wrong"})) == 401
        assert asyncio.run(attempt({"Authorization": "Api-Key plugrl-vector-key-0123456789abcdef"})) == 101


def test_a_bad_observation_choice_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=re.escape('observation="box" joins states into one vector')):
        RobotVectorEnv.from_params(
            DEMO,
            1,
            VectorSettings(port=0),
            observation="box",
            state_dims={"target": 4},
            image_shapes={"camera": [16, 16, 3]},
        )
