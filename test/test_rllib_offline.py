"""Recordings as RLlib offline data: ``plugrl-export --to rllib``, read by RLlib's own offline API.

The pure part: how a train recording's chunks and a teleop recording's ticks
become RL steps. The whole path, with real processes: a scripted person
demonstrates on the demo reachers (robot node, a bridge in teleop mode that
records, the scripted gamepad), ``plugrl-export --to rllib`` writes the
recording, RLlib's BC learns from it through ``config.offline_data``, and the
policy it learnt reaches the target where a random policy does not, on the
same reacher (simulated here, observed as the bridge observes it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from harness import ROOT, python_module, record_demo_teleop

from plugrl_ros.demo.reacher import Reacher, ReacherSpec
from plugrl_ros.rllib.offline import packed, rllib_episode, teleop_episodes, train_episodes, write_parquet
from plugrl_ros.serve.spaces import robot_spaces

pytestmark = [pytest.mark.rllib]

DEMO = ROOT / "config" / "demo.yaml"
RECORD_S = 40.0  # about 25 demonstrations on two reachers at 20 Hz


def demo_spaces(horizon: int = 1):
    return robot_spaces(DEMO, horizon=horizon, images=[], state_dims={"target": 4})


def observations(n: int) -> dict[str, np.ndarray]:
    """n observations of the demo's states whose joints' first value is the tick's index."""
    joints = np.zeros((n, 4))
    joints[:, 0] = np.arange(n)
    return {"observations/states/joints": joints, "observations/states/target": np.ones((n, 4))}


def teleop_arrays(person: list[bool], terminated_at: int | None = None) -> dict[str, np.ndarray]:
    n = len(person)
    commands = np.array([[t, -t] if p else [np.nan, np.nan] for t, p in enumerate(person)], dtype=np.float64)
    term = np.zeros(n, dtype=bool)
    if terminated_at is not None:
        term[terminated_at] = True
    return {
        **observations(n),
        "step_observed": np.array(person),
        "step_person": np.array(person),
        "step_actions": commands,
        "step_rewards": np.arange(n, dtype=np.float64),
        "step_terminated": term,
        "step_truncated": np.zeros(n, dtype=bool),
    }


def first_joint(episode) -> list[float]:
    return [float(o["states"]["joints"][0]) for o in episode.observations]


def test_a_demonstration_becomes_rl_steps_of_h_ticks_the_person_commanded_cut_where_the_person_rested():
    # ticks 0-4 commanded, 5 rested, 6-9 commanded and the last one terminated
    arrays = teleop_arrays([True] * 5 + [False] + [True] * 4, terminated_at=9)
    first, second = teleop_episodes(arrays, demo_spaces(horizon=2), "demo")
    # 0-1, 2-3 and the observation of tick 4 (tick 4 alone is no whole step): cut, truncated (bootstrapped)
    assert first_joint(first) == [0, 2, 4] and first.truncated and not first.terminated
    assert [a.tolist() for a in first.actions] == [[0, 0, 1, -1], [2, -2, 3, -3]]
    assert first.rewards == [0 + 1, 2 + 3] and first.intervened == [True, True]
    # 6-7, 8-9: terminated at 9 (its next observation is never bootstrapped from)
    assert first_joint(second) == [6, 8, 9] and second.terminated and not second.truncated
    assert second.rewards == [6 + 7, 8 + 9]


def test_a_demonstration_without_an_observation_after_its_last_step_ends_one_step_early():
    (episode,) = teleop_episodes(teleop_arrays([True] * 3 + [False] * 2), demo_spaces(), "demo")
    assert first_joint(episode) == [0, 1, 2] and len(episode) == 2 and episode.truncated


def test_a_train_episode_holds_the_chunks_as_executed_the_steps_a_person_commanded_replaced():
    horizon, chunks = 2, 3
    actions = np.arange(chunks * horizon * 2, dtype=np.float64).reshape(chunks, horizon, 2)
    person = np.zeros(chunks * horizon, dtype=bool)
    person[3] = True  # chunk 1's second step
    command = np.full((chunks * horizon, 2), np.nan)
    command[3] = [-1.5, 1.5]
    arrays = {
        **observations(chunks + 1),
        "actions": actions,
        "chunk_steps": np.full(chunks, horizon),
        "rewards": np.array([1.0, 2.0, 3.0]),
        "terminated": np.array([False, False, True]),
        "truncated": np.zeros(chunks, dtype=bool),
        "step_person": person,
        "step_person_command": command,
    }
    (episode,) = train_episodes(arrays, demo_spaces(horizon), "train")
    assert [a.tolist() for a in episode.actions] == [[0, 1, 2, 3], [4, 5, -1.5, 1.5], [8, 9, 10, 11]]
    assert episode.intervened == [False, True, False] and episode.terminated and len(episode.observations) == 4
    # the last chunk's feedback was lost: the episode ends one chunk early, truncated
    cut = {**arrays, **{k: v[:chunks] for k, v in observations(chunks).items()}}
    (short,) = train_episodes(cut, demo_spaces(horizon), "train")
    assert len(short) == 2 and short.truncated and not short.terminated


def test_a_recording_of_another_robot_is_refused_naming_what_differs():
    arrays = teleop_arrays([True] * 3)
    arrays["observations/states/target"] = np.ones((3, 2))
    with pytest.raises(ValueError, match=r"states/target has shape \[2\], the space declares \[4\]"):
        teleop_episodes(arrays, demo_spaces(), "env 0 episode 3")
    del arrays["observations/states/target"]
    with pytest.raises(ValueError, match="has no states/target"):
        teleop_episodes(arrays, demo_spaces(), "env 0 episode 3")


def test_written_episodes_read_back_as_rllib_reads_them_with_actions_normalised_as_the_module_gives_them(tmp_path):
    import msgpack
    import msgpack_numpy
    import pyarrow.parquet as pq
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    spaces = demo_spaces()
    (episode,) = teleop_episodes(teleop_arrays([True] * 3, terminated_at=2), spaces, "demo")
    episode.actions = [np.array([2.0, -1.0]), np.array([0.0, 1.0]), np.array([-2.0, 2.0])]
    assert write_parquet(packed([rllib_episode(episode, spaces, normalize_actions=True)]), tmp_path) == 1
    (item,) = pq.read_table(tmp_path).column("item").to_pylist()
    back = SingleAgentEpisode.from_state(msgpack.unpackb(item, object_hook=msgpack_numpy.decode))
    assert back.is_terminated and len(back) == 3
    assert np.allclose(back.get_actions(), [[1.0, -0.5], [0.0, 0.5], [-1.0, 1.0]])  # [-2, 2] -> [-1, 1]
    assert back.get_infos(-1) == {"intervened": True}
    assert back.get_observations(0)["states"]["joints"].dtype == np.float32


def write_demonstrations(folder: Path, episodes: int = 3, ticks: int = 20) -> int:
    """``episodes`` exported demonstrations of the demo's spaces (joints[0] = 100 + the tick); their steps."""
    spaces, written = demo_spaces(), []
    for _ in range(episodes):
        arrays = teleop_arrays([True] * ticks, terminated_at=ticks - 1)
        arrays["observations/states/joints"][:, 0] += 100.0
        arrays["step_actions"] = np.clip(arrays["step_actions"], -2.0, 2.0)
        written += teleop_episodes(arrays, spaces, "demo")
    write_parquet(packed(rllib_episode(e, spaces, normalize_actions=True) for e in written), folder)
    return sum(len(e) for e in written)


def robot_episode(length: int) -> Any:
    """An episode of the robot's own (joints[0] = -1), as the runner hands it to the replay buffer."""
    spaces = demo_spaces()
    (episode,) = teleop_episodes(teleop_arrays([True] * (length + 1)), spaces, "robot")
    for obs in episode.observations:
        obs["states"]["joints"][0] = -1.0
    return rllib_episode(episode, spaces, normalize_actions=True)


def test_the_replay_buffer_draws_the_demonstration_share_of_every_batch_however_many_robot_steps_it_holds(tmp_path):
    from ray.rllib.utils.from_config import from_config
    from ray.rllib.utils.replay_buffers import ReplayBuffer

    steps = write_demonstrations(tmp_path)
    config = {
        "type": "plugrl_ros.rllib.demonstrations.DemonstrationEpisodeReplayBuffer",  # built as RLlib builds it
        "capacity": 200,
        "demonstrations": [str(tmp_path)],
        "demonstration_share": 0.25,
        "flatten_observations": False,
    }
    buffer = from_config(ReplayBuffer, dict(config))
    assert buffer.demonstration_steps == steps == 3 * 20
    for _ in range(3):
        buffer.add([robot_episode(50) for _ in range(4)])  # past the capacity: the robots' oldest go
        batch = buffer.sample(num_items=64, n_step=1, gamma=0.99, sample_episodes=True)
        sources = [float(e.get_observations(0)["states"]["joints"][0]) for e in batch]
        assert len(batch) == 64 and sum(s >= 100 for s in sources) == 16 and sum(s == -1 for s in sources) == 48
    assert buffer.get_num_timesteps() <= 200 and buffer.demonstrations.get_num_timesteps() == steps
    with pytest.raises(ValueError, match=r"holds no \.parquet files"):
        from_config(ReplayBuffer, {**config, "demonstrations": [str(tmp_path / "nothing")]})


@pytest.mark.slow
@pytest.mark.ros
@pytest.mark.alone
@pytest.mark.timeout(600)
def test_bc_learns_from_exported_demonstrations_to_reach_the_target_where_a_random_policy_does_not(tmp_path):
    record, offline = tmp_path / "recording", tmp_path / "offline"
    # a demonstrator: drives from the first moment (no patience) and all the way onto the target
    person = ("--minutes", "0", "--stray", "0", "--patience", "0", "--release", "0.01")
    code, output = record_demo_teleop(record, RECORD_S, 16, *person)
    assert code == 0, output[-3000:]
    # the natural order, and no widths: the recording holds them (--images '' only chooses what BC reads)
    export = python_module(
        "plugrl_ros.record.export",
        *("--to", "rllib", *[str(p) for p in sorted(record.glob("*.mcap"))]),
        *("--output", str(offline), "--config", str(DEMO), "--images", ""),
    )
    done = subprocess.run(export, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "RLlib episode(s)" in done.stdout and list(offline.glob("*.parquet")), done.stdout
    steps = int(done.stdout.split("RL step(s)")[0].split()[-1])
    assert steps >= 300, done.stdout

    module = train_bc(offline)
    bc, random = evaluate(module), evaluate(None)
    print(f"BC: return {bc[0]:.2f}, {bc[1]} successes; random: {random[0]:.2f}, {random[1]}")
    assert bc[0] > random[0] + 2.0 and bc[1] >= random[1] + 10, (bc, random)


def train_bc(offline: Path):
    """BC as bench/imitation_bc.py configures it (the imitation benchmark's BC arm), 60 iterations."""
    import ray

    sys.path.insert(0, str(ROOT / "bench"))
    from imitation_bc import bc_config

    config = bc_config(DEMO, offline, seed=0)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        algo = config.build_algo()
        for _ in range(60):
            algo.train()
        module = algo.learner_group._learner.module["default_policy"]
        state = module.get_state()
        algo.stop()
    finally:
        ray.shutdown()
    module.set_state(state)
    return module


def evaluate(module, episodes: int = 40) -> tuple[float, int]:
    """Mean return and successes of ``module``'s greedy action (None: uniform random actions) on the demo reacher,
    observed as the bridge observes it (joints: angles then velocities; target: as the robot publishes it)."""
    import torch
    from ray.rllib.core.columns import Columns
    from ray.rllib.utils.spaces.space_utils import unsquash_action

    spaces = demo_spaces()
    rng = np.random.default_rng(7)
    reacher = Reacher(ReacherSpec(), np.random.default_rng(3))
    returns, successes = [], 0
    for _ in range(episodes):
        reacher.reset()
        total, terminated = 0.0, False
        for _ in range(60):
            if module is None:
                action = rng.uniform(-2.0, 2.0, size=2)
            else:
                # FlattenObservations' order: the Dict's keys sorted (joints, then target)
                flat = np.concatenate([np.concatenate([reacher.q, reacher.qd]), reacher.target_state()])
                with torch.no_grad():
                    out = module.forward_inference({Columns.OBS: torch.as_tensor(flat, dtype=torch.float32)[None]})
                dist = module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
                normalised = dist.to_deterministic().sample()[0].numpy()
                action = unsquash_action(normalised, spaces.action_space)
            reward, terminated = reacher.step(action)
            total += reward
            if terminated:
                break
        returns.append(total)
        successes += terminated
    return float(np.mean(returns)), successes


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
