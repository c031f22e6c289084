"""plugrl-gym-robot as a real process: its topics, reset seeds, /clock, refusals, discrete actions, the camera,
timer mode, and its printed config driving the real bridge."""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

pytest.importorskip("gymnasium")

import gymnasium
from harness import ROOT, Child, free_port, python_module, ros_env, wait_until
from rosgraph_msgs.msg import Clock
from std_msgs.msg import Bool, Float64, Float64MultiArray
from std_srvs.srv import Trigger
from test_faults import shown
from trainer_fixture import ScriptedTrainer

from plugrl_ros.gym.copies import episode_seed

pytestmark = [pytest.mark.gym, pytest.mark.ros, pytest.mark.slow, pytest.mark.timeout(180)]

ROBOT = "plugrl_ros.gym.robot_node"


@contextmanager
def gym_robot(*args: str) -> Iterator[Child]:
    with shown(Child(python_module(ROBOT, *args)), "gym robot") as child:
        yield child


def reference(env_id: str, seed: int, copy: int = 0, episode: int = 0):
    env = gymnasium.make(env_id)
    observation, _ = env.reset(seed=episode_seed(seed, copy, episode))
    return env, observation


def latest(inbox) -> np.ndarray:
    return np.asarray(inbox.msgs()[-1].data, dtype=np.float64)


def matched_publisher(robot, topic: str):
    publisher = robot.publisher(Float64MultiArray, topic)
    wait_until(lambda: publisher.get_subscription_count() > 0, 30, f"the gym robot to subscribe to {topic}")
    return publisher


def test_bad_actions_are_refused_naming_their_topic_and_never_step_the_env(robot):
    observations = robot.listen(Float64MultiArray, "/gym1/observation")
    rewards = robot.listen(Float64, "/gym1/reward")
    with gym_robot("--env", "Pendulum-v1", "--copies", "2", "--seed", "4") as child:
        answer = robot.call(Trigger, "/gym1/reset", Trigger.Request())
        assert answer.success and answer.message == f"gym1: episode 0, seed {episode_seed(4, 1, 0)}"
        env, expected = reference("Pendulum-v1", 4, copy=1)
        wait_until(lambda: len(observations) == 1, 20, "the reset observation")
        assert np.array_equal(latest(observations), expected.astype(np.float64))
        action = matched_publisher(robot, "/gym1/action")
        for bad in ([0.1, 0.2], [math.nan], [math.inf], []):
            action.publish(Float64MultiArray(data=bad))
        wait_until(lambda: "gym1/action: action refused, expected 1 value(s), got 2" in child.output(), 20, "a warning")
        # throttled per reason: the NaN right after the wrong width is reported too (the inf is the same reason)
        wait_until(lambda: "gym1/action: action refused, it holds NaN" in child.output(), 20, "the NaN's warning")
        action.publish(Float64MultiArray(data=[0.5]))
        wait_until(lambda: len(rewards) == 1, 20, "the one good action's step")
        expected, reward, *_ = env.step(np.array([0.5], dtype=np.float32))
        assert len(observations) == 2 and np.array_equal(latest(observations), expected.astype(np.float64))
        assert rewards.msgs()[0].data == float(reward)


def test_lockstep_publishes_simulated_time_on_clock_one_env_dt_per_step(robot):
    clock = robot.listen(Clock, "/clock")
    rewards = robot.listen(Float64, "/gym0/reward")
    with gym_robot("--env", "InvertedPendulum-v5"):
        wait_until(lambda: len(clock) > 0, 20, "/clock before any step")
        assert Clock_ns(clock.msgs()[-1]) == 40_000_000, "one step in: a clock at 0 reads as no clock"
        robot.call(Trigger, "/gym0/reset", Trigger.Request())
        action = matched_publisher(robot, "/gym0/action")
        for k in range(3):
            action.publish(Float64MultiArray(data=[0.0]))
            wait_until(lambda k=k: len(rewards) == k + 1, 20, f"step {k}")
        wait_until(lambda: Clock_ns(clock.msgs()[-1]) == 4 * 40_000_000, 20, "the clock three steps on")


def Clock_ns(msg: Clock) -> int:
    return msg.clock.sec * 1_000_000_000 + msg.clock.nanosec


def test_a_discrete_action_is_rounded_to_the_nearest_allowed_value_and_an_ended_episode_takes_no_step(robot):
    observations = robot.listen(Float64MultiArray, "/gym0/observation")
    terminated = robot.listen(Bool, "/gym0/terminated")
    with gym_robot("--env", "CartPole-v1") as child:
        robot.call(Trigger, "/gym0/reset", Trigger.Request())
        env, _ = reference("CartPole-v1", 0)
        action = matched_publisher(robot, "/gym0/action")
        done, sent = False, 0
        for value in (0.7, 0.2, 5.0, -3.0, 0.51, 0.49) * 10:
            if done:
                break
            expected, _, done, _, _ = env.step(int(value >= 0.5))
            action.publish(Float64MultiArray(data=[value]))
            sent += 1
            wait_until(lambda sent=sent: len(terminated) == sent, 20, f"step {sent}")
            assert np.array_equal(latest(observations), expected.astype(np.float64)), f"step {sent}"
        assert done and terminated.msgs()[-1].data
        action.publish(Float64MultiArray(data=[1.0]))
        wait_until(lambda: "the episode is over (call gym0/reset)" in child.output(), 20, "the refusal")
        assert len(terminated) == sent


def test_an_unknown_env_or_module_or_a_bad_camera_size_fails_at_startup_with_the_reason():
    failed = subprocess.run(
        python_module(ROBOT, "--env", "NoSuchEnv-v0"),
        env=ros_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failed.returncode == 2 and "NoSuchEnv-v0" in failed.stderr and "doesn't exist" in failed.stderr
    # a team's env named module:ID whose module is not there
    failed = subprocess.run(
        python_module(ROBOT, "--env", "no_such_robots.envs:Arm-v0"), env=ros_env(), capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert failed.returncode == 2, failed.stderr
    assert "the module 'no_such_robots.envs' that should register Arm-v0 cannot be imported" in failed.stderr
    failed = subprocess.run(
        python_module(ROBOT, "--env", "Pendulum-v1", "--camera", "64"),
        env=ros_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert failed.returncode == 2 and "'64' is not WIDTHxHEIGHT" in failed.stderr


@pytest.mark.websockets_incidental
@pytest.mark.parametrize(
    ("env_id", "mode"),
    [("Pendulum-v1", "timer"), ("InvertedPendulum-v5", "lockstep")],
)
def test_the_camera_reaches_the_trainer_through_the_printed_config(tmp_path, env_id, mode):
    """Classic control renders with pygame and is resized; MuJoCo renders at the size itself (headless EGL)."""
    options = ["--env", env_id, "--copies", "2", "--mode", mode, "--rate", "50", "--camera", "32x24"]
    printed = subprocess.run(
        python_module(ROBOT, *options, "--print-config"), env=ros_env(), capture_output=True, text=True, check=True
    )
    config = tmp_path / "gym.yaml"
    config.write_text(printed.stdout)
    metadata = {"protocol_version": 1, "action_horizon": 2, "action_dim": 1}
    with ScriptedTrainer(metadata) as trainer, gym_robot(*options) as gym:
        bridge = python_module(
            "plugrl_ros.node.bridge_main",
            "--ros-args",
            "--params-file",
            str(config),
            "-p",
            f"trainer.uri:={trainer.uri}",
        )
        with shown(Child(bridge), "bridge"):
            feedbacks = trainer.wait_for(
                lambda records: len(fed := [m for _, m in records if m["message_type"] == "feedback"]) >= 10 and fed,
                90,
                "10 feedbacks",
            )
        assert "camera 32x24" in gym.output()
    pictures = [f["data"]["obs"]["images"]["camera"] for f in feedbacks]
    assert all(p.dtype == np.uint8 and p.shape[1:] == (24, 32, 3) for p in pictures)
    assert len({p.tobytes() for p in pictures}) > 1, "the pictures show the env moving"
    assert all(f["data"]["obs"]["states"]["observation"].shape[1] in (3, 4) for f in feedbacks)


@pytest.mark.websockets_incidental
def test_the_documented_commands_train_on_a_gymnasium_env_through_ros(tmp_path):
    """docs/gym.md's three commands (the README links it), as written (the first, the install, is how CI's gym
    pass made this venv), with the demo trainer it names: the robot, the printed config, the bridge; the learner
    improves."""
    section = (ROOT / "docs/gym.md").read_text().split("\n## ")[0]
    install, robot_line, bridge_line = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1).splitlines()
    assert install.startswith('scripts/setup-venv.sh .venv kilted "" gym')
    assert robot_line.endswith(" &") and "TRAINER:8000" in bridge_line
    trainer_line = re.search(r"`(plugrl-demo-trainer [^`]*)`", section.replace("\n", " ")).group(1)
    port = free_port()
    trainer_command = trainer_line.replace("--port 8000", f"--port {port}") + " --duration 25"
    # exec: a stop (SIGINT) must reach the bridge itself, not the shell that started it
    bridge_command = bridge_line.replace("TRAINER:8000", f"127.0.0.1:{port}").replace("&& plugrl-", "&& exec plugrl-")
    shell = ["bash", "-c"]
    with shown(Child([*shell, f"exec {trainer_command}"]), "demo trainer") as trainer:
        with shown(Child([*shell, f"cd {tmp_path} && exec {robot_line.removesuffix('&')}"]), "gym robot"):
            with shown(Child([*shell, f"cd {tmp_path} && {bridge_command}"]), "bridge") as bridge:
                assert trainer.wait(90) == 0, trainer.output()
                assert bridge.wait(30) == 0, bridge.output()
    summary = dict(re.findall(r"(\w+) (-?[\d.]+)", trainer.output().split("summary: ", 1)[1].splitlines()[0]))
    assert int(summary["episodes"]) >= 40, summary
    assert float(summary["last_mean_return"]) > float(summary["first_mean_return"]), summary
    assert "episode.max_steps" not in bridge.output(), "the printed config needs no correction"
