"""Through plugrl-gym-robot and the bridge a trainer receives exactly the transitions of the env stepped directly.

One run per case: the gym robot and the bridge (configured by the robot's own
``--print-config``, recording to MCAP) as real ROS processes in lockstep, and a
scripted trainer sending seeded random in-range action chunks. Afterwards two
things are replayed against fresh envs built with the same seeds, transition
by transition:

* what the trainer received (every infer and feedback, per env): the
  observations bit for bit (float64) or widened exactly (float32), the reward
  summed over each chunk, the terminated/truncated flags, the terminal
  observation, truncation at the env's own time limit;
* the recording, episode by episode: every step's command (the chunk row the
  trainer sent, through the bridge's clipping) is stepped on the fresh env,
  and its reward and flags, and each chunk's fed-back observation and reward
  sum must be the recorded ones. What the env received is thereby what was
  recorded: any other action (or a step more or less) changes the env's next
  state, and so every later observation, bit for bit.

A dropped, duplicated or reordered step changes every later observation of
its env, so each of these comparisons fails on it (mutation-checked by hand:
a robot that ignored one action in 40, stepped one action twice, or published
the observation of the step before).
"""

from __future__ import annotations

import os
import subprocess
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from harness import Child, python_module, ros_env
from test_faults import shown
from trainer_fixture import ScriptedTrainer

from plugrl_ros.gym.copies import GymCopy
from plugrl_ros.record.export import EpisodeAssembler, iter_episodes

pytestmark = [pytest.mark.gym, pytest.mark.ros, pytest.mark.websockets, pytest.mark.slow, pytest.mark.timeout(240)]

SEED = 11
# a team's own env (a Dict observation: one state per key), named module:ID; the children import it from here
TEAM_ENV = "gym_team_envs:PlugrlTeamDict-v0"
HERE = Path(__file__).resolve().parent


def child_env() -> dict[str, str]:
    """A child's environment, with this folder on its path (where the team env's module is)."""
    env = ros_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    return env


def generated_config(tmp_path: Path, env_id: str, copies: int) -> Path:
    """The bridge's params file exactly as ``plugrl-gym-robot --print-config`` prints it."""
    printed = subprocess.run(
        python_module("plugrl_ros.gym.robot_node", "--env", env_id, "--copies", str(copies), "--print-config"),
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    path = tmp_path / "gym.yaml"
    path.write_text(printed.stdout)
    return path


def bits(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype=np.float64).tobytes()


def state_bits(states: dict, row: int | None = None) -> dict[str, bytes]:
    """Every state of an observation (one per key of a Dict env) as float64 bytes; ``row``: of a batch."""
    return {name: bits(values if row is None else values[row]) for name, values in states.items()}


def recorded_bits(arrays: dict, prefix: str, index: int) -> dict[str, bytes]:
    """The states of a recorded episode's ``observations`` or ``next_observations`` at ``index``."""
    start = f"{prefix}/states/"
    return {key.removeprefix(start): bits(values[index]) for key, values in arrays.items() if key.startswith(start)}


class Run:
    """What one run left: the trainer's records and the chunks it sent, and the recording."""

    def __init__(self, env_id: str, copies: int, horizon: int, feedbacks: int, tmp_path: Path) -> None:
        self.env_id, self.copies, self.horizon = env_id, copies, horizon
        layout = GymCopy(env_id, 0, SEED).action
        rng = np.random.default_rng(SEED)
        self.sent: dict[int, list[np.ndarray]] = defaultdict(list)  # env -> the chunks it was sent, in order

        def actions(env_indices, step_ids, observation):
            del step_ids, observation
            # in range, so the bridge's clipping to the space's bounds must leave every value as it is
            chunk = rng.uniform(layout.low, layout.high, size=(horizon, len(env_indices), layout.width))
            for row, env in enumerate(env_indices):
                self.sent[int(env)].append(chunk[:, row].copy())
            return chunk

        metadata = {"protocol_version": 1, "server": "exactness", "action_horizon": horizon, "action_dim": layout.width}
        config = generated_config(tmp_path, env_id, copies)
        record = tmp_path / "record"
        robot = python_module(
            "plugrl_ros.gym.robot_node", "--env", env_id, "--copies", str(copies), "--seed", str(SEED)
        )
        with ScriptedTrainer(metadata, actions) as trainer:
            bridge = python_module(
                "plugrl_ros.node.bridge_main",
                *("--ros-args", "--params-file", str(config)),
                *("-p", f"trainer.uri:={trainer.uri}", "-p", f"record.path:={record}"),
            )
            with shown(Child(robot, child_env()), "gym robot"), shown(Child(bridge), "bridge") as bridge_child:
                trainer.wait_for(
                    lambda records: sum(m["message_type"] == "feedback" for _, m in records) >= feedbacks,
                    150,
                    f"{feedbacks} feedbacks",
                )
                assert bridge_child.stop() == 0, bridge_child.output()
            self.records = trainer.records()
            assert trainer.connections == 1 and not trainer.violations, trainer.violations
        self.recordings = sorted(record.glob("*.mcap"))


def check_what_the_trainer_received(run: Run) -> int:
    """Per env, every (infer, chunk, feedback) against a fresh env stepped with the chunk; the steps replayed."""
    steps = 0
    for env in range(run.copies):
        copy = GymCopy(run.env_id, env, SEED)
        messages = []
        for _, message in run.records:
            rows = {int(e): row for row, e in enumerate(message["env_indices"])}
            if env in rows:
                messages.append((message, rows[env]))
        infers = [(m, r) for m, r in messages if m["message_type"] == "infer"]
        feedbacks = [(m, r) for m, r in messages if m["message_type"] == "feedback"]
        assert [m["message_type"] for m, _ in messages[: 2 * len(feedbacks)]] == ["infer", "feedback"] * len(feedbacks)
        assert len(run.sent[env]) == len(infers)
        ended = True
        for (infer, i_row), chunk, (feedback, f_row) in zip(infers, run.sent[env], feedbacks):
            if ended:
                copy.reset()
                assert int(infer["step_ids"][i_row]) == 0
            observed = state_bits(infer["data"]["states"], i_row)
            assert observed == state_bits(copy.states()), f"env {env}: infer observation differs"
            reward = 0.0
            for k in range(run.horizon):
                result = copy.step(copy.action.clip(chunk[k]))
                reward += result.reward
                steps += 1
                if copy.over:
                    break
            data = feedback["data"]
            # the terminal observation, before any reset
            assert state_bits(data["obs"]["states"], f_row) == state_bits(copy.states()), f"env {env}: feedback obs"
            assert data["rewards"][f_row] == np.float32(reward), f"env {env}: chunk reward"
            assert bool(data["terminated"][f_row]) == result.terminated
            # an episode that ends both ways at once is fed back as terminated only (its last step is terminal)
            assert bool(data["truncated"][f_row]) == (result.truncated and not result.terminated)
            ended = copy.over
    return steps


def check_the_recording(run: Run) -> tuple[int, dict[str, int]]:
    """Every recorded episode replayed step by step on a fresh env; (steps, how many episodes ended how)."""
    assert len(run.recordings) == 1, run.recordings
    readers: list = []
    episodes = list(iter_episodes(run.recordings, EpisodeAssembler(), readers))
    assert readers[-1].complete, readers[-1].problem
    copies = [GymCopy(run.env_id, env, SEED) for env in range(run.copies)]
    ends = {"terminated": 0, "truncated": 0}
    steps = 0
    for episode in episodes:
        a, env, copy = episode.arrays, episode.env, copies[episode.env]
        assert episode.index == copy.episodes and bool(a["complete"]), "every episode, in order, none cut"
        copy.reset()
        assert recorded_bits(a, "observations", 0) == state_bits(copy.states())
        t = 0
        for c, chunk in enumerate(a["actions"]):
            assert recorded_bits(a, "observations", c) == state_bits(copy.states()), f"env {env} chunk {c}: observation"
            chunk_reward = 0.0
            for k in range(int(a["chunk_steps"][c])):
                command = a["commanded/actions.action"][t]
                assert bits(command) == bits(chunk[k]), "clipping to the space's bounds changed an in-range action"
                assert bits(a["step_actions"][t]) == bits(chunk[k])
                result = copy.step(command)
                assert a["step_rewards"][t] == result.reward, f"env {env} step {t}: reward"
                assert bool(a["step_terminated"][t]) == result.terminated, f"env {env} step {t}: terminated"
                assert bool(a["step_truncated"][t]) == result.truncated, f"env {env} step {t}: truncated"
                chunk_reward += result.reward
                t += 1
            fed_back = recorded_bits(a, "next_observations", c)
            assert fed_back == state_bits(copy.states()), f"env {env} chunk {c}: fed back obs"
            assert np.float32(a["rewards"][c]) == np.float32(chunk_reward)
        assert copy.over and t == int(a["episode_length"]) == copy.steps
        assert recorded_bits(a, "observations", -1) == state_bits(copy.states()), "the terminal observation"
        ends["terminated" if bool(a["terminated"][-1]) else "truncated"] += 1
        steps += t
    return steps, ends


@pytest.mark.parametrize(
    ("env_id", "copies", "horizon", "feedbacks", "ends"),
    [
        # classic control, float32 observations: no termination, truncation at 200 steps (200 % 3 != 0: the
        # limit cuts a chunk short)
        ("Pendulum-v1", 1, 3, 160, ("truncated",)),
        # MuJoCo, float64 observations: random actions topple the pole within a few steps (terminations)
        ("InvertedPendulum-v5", 3, 4, 150, ("terminated",)),
        # MuJoCo with a 50-step limit (50 % 4 != 0), one step per chunk on one copy, chunks of 4 on the other
        ("Reacher-v5", 2, 4, 90, ("truncated",)),
        ("Reacher-v5", 1, 1, 160, ("truncated",)),
        # a team's own env from its module (module:ID): a Dict observation (float64, float32 and Discrete states),
        # episodes ending both ways
        (TEAM_ENV, 2, 3, 90, ("terminated", "truncated")),
    ],
)
def test_the_trainer_receives_exactly_the_transitions_of_the_env_stepped_directly(
    tmp_path, env_id, copies, horizon, feedbacks, ends
):
    run = Run(env_id, copies, horizon, feedbacks, tmp_path)
    received_steps = check_what_the_trainer_received(run)
    recorded_steps, counted = check_the_recording(run)
    for end in ends:
        assert counted[end] >= 1, f"no episode ended {end}: the case proves nothing about it ({counted})"
    assert recorded_steps >= 50 * copies or counted["terminated"] >= 3 * copies, (recorded_steps, counted)
    # the recording holds every complete episode; the trainer's view also the running ones
    assert recorded_steps <= received_steps
