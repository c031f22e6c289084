"""Which recorded steps become LeRobot frames (plugrl_ros.lerobot.frames), the names and the rate the export
takes from the recording's parameters (plugrl_ros.lerobot.names), LeRobot's statistics (plugrl_ros.lerobot.stats).
Pure numpy: no extra needed."""

from __future__ import annotations

import numpy as np
import pytest

from plugrl_ros.lerobot.frames import frames_of
from plugrl_ros.lerobot.names import action_names, fps_of, state_names
from plugrl_ros.lerobot.stats import aggregate, image_stats, vector_stats


def teleop_arrays(person: list[bool], terminated_at: int | None = None) -> dict[str, np.ndarray]:
    n = len(person)
    term = np.zeros(n, dtype=bool)
    if terminated_at is not None:
        term[terminated_at] = True
    return {
        "observations/states/joints": np.arange(n, dtype=np.float64)[:, None] * np.ones((1, 4)),
        "observations/images/camera": np.full((n, 4, 4, 3), np.arange(n, dtype=np.uint8)[:, None, None, None]),
        "step_observed": np.array(person),
        "step_person": np.array(person),
        "step_actions": np.array([[t, -t] if p else [np.nan, np.nan] for t, p in enumerate(person)]),
        "step_rewards": np.arange(n, dtype=np.float64) / 10,
        "step_terminated": term,
        "step_truncated": np.zeros(n, dtype=bool),
    }


def test_a_demonstration_becomes_one_lerobot_episode_per_run_of_commanded_steps_cut_where_the_person_rested():
    parts = frames_of("teleop", teleop_arrays([True, True, False, True, True, True], terminated_at=5))
    assert [len(p) for p in parts] == [2, 3]
    second = parts[1]
    assert second.states["joints"][:, 0].tolist() == [3, 4, 5]
    assert second.images["camera"][:, 0, 0, 0].tolist() == [3, 4, 5]
    assert second.action.tolist() == [[3, -3], [4, -4], [5, -5]]
    assert second.reward.tolist() == [0.3, 0.4, 0.5]
    assert second.done.tolist() == [False, False, True]
    assert parts[0].done.tolist() == [False, False]  # the rest cut it: the recording did not end it there


def train_arrays(chunk_steps: list[int], person: list[bool] | None = None) -> dict[str, np.ndarray]:
    k, t = len(chunk_steps), sum(chunk_steps)
    arrays = {
        "observations/states/joints": np.arange(k + 1, dtype=np.float64)[:, None] * np.ones((1, 4)),
        "actions": np.arange(k, dtype=np.float64)[:, None, None] * np.ones((1, 1, 2)),
        "chunk_steps": np.array(chunk_steps),
        "step_actions": np.repeat(np.arange(k, dtype=np.float64), chunk_steps)[:, None] * np.ones((1, 2)),
        "step_rewards": np.arange(t, dtype=np.float64),
        "step_terminated": np.arange(t) == t - 1,
        "step_truncated": np.zeros(t, dtype=bool),
    }
    if person is not None:
        arrays["step_person"] = np.array(person)
        arrays["step_person_command"] = np.array([[9.0, 9.0] if p else [np.nan, np.nan] for p in person])
    return arrays


def test_a_train_episodes_frames_hold_the_chunks_observation_and_the_persons_command_on_a_persons_steps():
    (part,) = frames_of("train", train_arrays([1, 1, 1], person=[False, True, False]))
    assert part.states["joints"][:, 0].tolist() == [0, 1, 2]  # not the final observation fed back
    assert part.action.tolist() == [[0, 0], [9, 9], [2, 2]]
    assert part.reward.tolist() == [0, 1, 2]
    assert part.done.tolist() == [False, False, True]


def test_a_chunk_that_never_ran_cuts_a_train_episode():
    parts = frames_of("train", train_arrays([1, 0, 1, 1]))
    assert [p.states["joints"][:, 0].tolist() for p in parts] == [[0], [2, 3]]
    assert [p.action[:, 0].tolist() for p in parts] == [[0], [2, 3]]


def test_recordings_without_an_observation_per_step_are_refused_naming_why():
    arrays = train_arrays([1, 1])
    arrays["actions"] = np.zeros((2, 5, 2))
    with pytest.raises(ValueError, match="H = 5 steps"):
        frames_of("train", arrays)
    with pytest.raises(ValueError, match=r"deploy-mode recording .* one per chunk"):
        frames_of("deploy", arrays)


def test_names_and_rate_come_from_the_recorded_parameters():
    parameters = {
        "control.rate_hz": 20.0,
        "observations.states.joints.joints": ["shoulder", "elbow"],
        "observations.states.joints.fields": ["position", "velocity"],
        "actions.arm.slice": [0, 2],
        "actions.arm.topic": "command",
        "actions.gripper.slice": [2, 3],
        "actions.gripper.joints": ["finger"],
    }
    assert state_names(parameters, "joints", 4) == [
        "shoulder.position",
        "elbow.position",
        "shoulder.velocity",
        "elbow.velocity",
    ]
    assert state_names(parameters, "target", 2) == ["target.0", "target.1"]
    assert action_names(parameters, 3) == ["arm.0", "arm.1", "finger"]
    assert fps_of(parameters) == 20
    with pytest.raises(ValueError, match="whole number"):
        fps_of({"control.rate_hz": 12.5})


def test_statistics_are_lerobots_per_element_and_per_channel_and_aggregate_to_the_whole():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(100, 3))
    whole, halves = vector_stats(values), [vector_stats(values[:30]), vector_stats(values[30:])]
    assert set(whole) == {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}
    assert whole["mean"].shape == (3,) and whole["count"].tolist() == [100]
    together = aggregate(halves)
    for key in ("min", "max", "mean", "std"):
        np.testing.assert_allclose(together[key], whole[key], rtol=1e-12)
    assert together["count"].tolist() == [100]
    images = rng.integers(0, 256, size=(10, 4, 4, 3), dtype=np.uint8)
    stats = image_stats(images)
    assert stats["mean"].shape == (3, 1, 1) and stats["count"].tolist() == [10]
    np.testing.assert_allclose(stats["max"].ravel(), images.reshape(-1, 3).max(axis=0) / 255.0)
