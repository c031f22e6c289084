"""The rollout core: chunk accounting, episodes, reconnects, pausing, and multi-env scheduling.

The scheduling tests run a deterministic simulation of timer-mode stepping
(a fake clock, a trainer with latency, robots that reset for different
durations or go silent) and check the invariants of docs/design.md on every run.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pytest

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.connection import Phase
from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.rollout.rollout import Rollout, RolloutSettings
from plugrl_ros.rollout.timer_steps import MIN_STEP_FRACTION, TimerSteps
from plugrl_ros.tools.probe_env import action_value, episode_length


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def obs(t: float) -> ObservationRow:
    return ObservationRow(states={"t": np.array([float(t)])})


def metadata_frame(horizon=None, width=None, features=(), **advisory) -> bytes:
    data = {"features": list(features), **advisory}
    if horizon:
        data["action_horizon"] = horizon
    if width:
        data["action_dim"] = width
    return codec.packb({"message_type": "metadata", "data": data})


def action_frame(env_ids, horizon, width) -> bytes:
    values = np.array(
        [[[action_value(k, e, j) for j in range(width)] for e in env_ids] for k in range(horizon)], dtype="<f4"
    ).reshape(horizon, len(env_ids), width)
    return codec.packb({"message_type": "action", "data": {"env_ids": np.asarray(env_ids, "<i8"), "action": values}})


def connect(rollout: Rollout, horizon=3, width=1, features=(), **advisory) -> None:
    rollout.on_connected(rollout.epoch + 1)
    result = rollout.on_frame(rollout.epoch, metadata_frame(horizon, width, features, **advisory))
    assert result.kind == "metadata"


def messages(outgoing) -> list[dict]:
    return [codec.unpackb(o.encode()) for o in outgoing]


def answer(rollout: Rollout, infer: dict, horizon=3, width=1) -> None:
    envs = infer["env_indices"].tolist()
    result = rollout.on_frame(rollout.epoch, action_frame(envs, horizon, width))
    assert result.kind == "action", result.detail


def test_a_chunk_feeds_back_the_summed_reward_and_the_observation_after_its_last_step():
    rollout = Rollout(RolloutSettings(n_envs=1), Clock())
    connect(rollout, horizon=3)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    assert infer["message_type"] == "infer" and infer["step_ids"].tolist() == [0]
    answer(rollout, infer)
    for k, reward in enumerate([0.5, 1.0, 2.0]):
        assert rollout.take_step(0).tolist() == [action_value(k, 0, 0)]
        assert rollout.take_step(0) is None  # one step at a time
        ended = rollout.finish_step(0, reward, False, False, False, obs(k + 1))
        assert ended == (k == 2)
    feedback, infer2 = messages(rollout.poll(lambda env: obs(99)))
    assert feedback["message_type"] == "feedback"
    assert feedback["data"]["rewards"].tolist() == [3.5]
    assert feedback["data"]["obs"]["states"]["t"].tolist() == [[3.0]]
    assert feedback["step_ids"].tolist() == [0]
    assert feedback["data"]["info"] == {}
    # without the reuse feature the feedback's observation is sent again, not a new capture
    assert infer2["data"]["states"]["t"].tolist() == [[3.0]]
    assert infer2["step_ids"].tolist() == [1]


def test_reuse_is_used_when_offered_so_the_observation_crosses_once():
    rollout = Rollout(RolloutSettings(n_envs=2), Clock())
    connect(rollout, horizon=1, features=["reuse-feedback-obs"])
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=1)
    for env in (0, 1):
        rollout.take_step(env)
        rollout.finish_step(env, 1.0, env == 1, False, False, obs(1))
    rollout.reset_done(1)
    _, infer2 = messages(rollout.poll(lambda env: obs(0)))
    assert infer2["env_indices"].tolist() == [0, 1]
    # env 0's feedback was not terminal: reused; env 1 ended its episode: its reset observation is sent
    assert infer2["reuse"].tolist() == [True, False]
    assert infer2["data"]["states"]["t"].tolist() == [[0.0]]


def _one_env_ends_while_the_other_goes_on(rollout: Rollout) -> None:
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=1)
    for env in (0, 1):
        rollout.take_step(env)
        rollout.finish_step(env, 1.0, env == 1, False, False, obs(1))
    assert rollout.needs_reset(1)


def test_a_same_step_vector_env_gets_every_env_in_each_infer_once_resets_are_done():
    clock = Clock()
    rollout = Rollout(RolloutSettings(n_envs=2, feedback_deadline_s=5.0), clock)
    connect(rollout, horizon=1, features=["reuse-feedback-obs"], vector_autoreset="same-step")
    assert rollout.together
    _one_env_ends_while_the_other_goes_on(rollout)
    assert rollout.poll(lambda env: obs(0)) == []  # env 1 resets: the feedback waits for it
    rollout.reset_done(1)
    feedback, infer = messages(rollout.poll(lambda env: obs(0)))
    assert feedback["env_indices"].tolist() == [0, 1] and feedback["data"]["terminated"].tolist() == [False, True]
    assert infer["env_indices"].tolist() == [0, 1] and infer["reuse"].tolist() == [True, False]


@pytest.mark.parametrize("autoreset", [None, "same-step", "next-step"])
def test_a_vector_env_gets_one_feedback_for_every_envs_chunk_however_long_one_step_takes(autoreset):
    clock = Clock()
    rollout = Rollout(RolloutSettings(n_envs=2, feedback_deadline_s=5.0, batch_window_s=0.02), clock)
    advisory = {} if autoreset is None else {"vector_autoreset": autoreset}
    connect(rollout, horizon=1, features=["reuse-feedback-obs"], **advisory)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=1)
    rollout.take_step(0)
    rollout.take_step(1)
    rollout.finish_step(0, 1.0, False, False, False, obs(1))  # env 1's step takes a second longer
    clock.now = 1.0
    early = messages(rollout.poll(lambda env: obs(0)))
    if autoreset is None:  # an ordinary trainer: env 0 goes on past the batch window
        assert [m["env_indices"].tolist() for m in early] == [[0], [0]]
        return
    assert early == []  # a vector env: env 0's feedback waits for env 1's step
    rollout.finish_step(1, 1.0, False, False, False, obs(1))
    feedback, infer = messages(rollout.poll(lambda env: obs(0)))
    assert feedback["env_indices"].tolist() == [0, 1] and infer["env_indices"].tolist() == [0, 1]


def test_past_the_feedback_deadline_the_feedback_goes_and_the_infer_still_waits_for_every_env():
    clock = Clock()
    rollout = Rollout(RolloutSettings(n_envs=2, feedback_deadline_s=5.0), clock)
    connect(rollout, horizon=1, vector_autoreset="same-step")
    _one_env_ends_while_the_other_goes_on(rollout)
    clock.now = 5.0
    [feedback] = messages(rollout.poll(lambda env: obs(0)))  # the deadline: sent without env 1's reset
    assert feedback["message_type"] == "feedback"
    assert rollout.poll(lambda env: obs(0)) == []  # nothing in flight; the infer waits for env 1
    rollout.reset_done(1)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    assert infer["env_indices"].tolist() == [0, 1]


def test_a_next_step_vector_env_gets_the_env_that_reset_one_exchange_after_the_others():
    rollout = Rollout(RolloutSettings(n_envs=2, feedback_deadline_s=5.0), Clock())
    connect(rollout, horizon=1, features=["reuse-feedback-obs"], vector_autoreset="next-step")
    assert rollout.together and rollout.reset_step
    _one_env_ends_while_the_other_goes_on(rollout)
    assert rollout.poll(lambda env: obs(0)) == []  # env 1 resets: the feedback waits for it
    rollout.reset_done(1)
    feedback, infer = messages(rollout.poll(lambda env: obs(0)))
    assert feedback["data"]["terminated"].tolist() == [False, True]
    assert infer["env_indices"].tolist() == [0]  # env 1 sits out: the trainer spends this step on its reset
    answer(rollout, infer, horizon=1)
    rollout.take_step(0)
    rollout.finish_step(0, 1.0, False, False, False, obs(2))
    feedback, infer = messages(rollout.poll(lambda env: obs(0)))
    assert feedback["env_indices"].tolist() == [0]
    assert infer["env_indices"].tolist() == [0, 1] and infer["reuse"].tolist() == [True, False]
    assert infer["step_ids"].tolist() == [2, 0]


def test_envs_that_all_ended_together_are_asked_for_at_once_after_their_resets():
    rollout = Rollout(RolloutSettings(n_envs=2, feedback_deadline_s=5.0), Clock())
    connect(rollout, horizon=1, vector_autoreset="next-step")
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=1)
    for env in (0, 1):
        rollout.take_step(env)
        rollout.finish_step(env, 1.0, False, True, False, obs(1))
        rollout.reset_done(env)
    _, infer = messages(rollout.poll(lambda env: obs(0)))
    assert infer["env_indices"].tolist() == [0, 1]  # nobody goes on without them: no one sits out


def test_without_vector_autoreset_the_env_that_goes_on_does_not_wait_for_the_reset():
    rollout = Rollout(RolloutSettings(n_envs=2, feedback_deadline_s=5.0), Clock())
    connect(rollout, horizon=1, vector_autoreset=True)  # not a mode: ignored, as every malformed advisory key
    assert not rollout.together and rollout.metadata.ignored == ("vector_autoreset",)
    _one_env_ends_while_the_other_goes_on(rollout)
    feedback, infer = messages(rollout.poll(lambda env: obs(0)))
    assert feedback["message_type"] == "feedback" and infer["env_indices"].tolist() == [0]


def test_the_terminal_observation_is_fed_back_and_the_reset_observation_starts_the_next_episode():
    rollout = Rollout(RolloutSettings(n_envs=1), Clock())
    connect(rollout, horizon=5)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=5)
    rollout.take_step(0)
    rollout.finish_step(0, 1.0, False, False, False, obs(1))
    rollout.take_step(0)
    assert rollout.finish_step(0, 1.0, True, False, True, obs(2))  # terminal at step 2 of 5: the chunk ends
    assert rollout.take_step(0) is None
    assert rollout.needs_reset(0)
    [feedback] = messages(rollout.poll(lambda env: obs(0)))  # no infer: the env is resetting
    assert feedback["data"]["terminated"].tolist() == [True]
    assert feedback["data"]["obs"]["states"]["t"].tolist() == [[2.0]]
    episode = feedback["data"]["info"]["episode"]
    assert episode["r"].tolist() == [2.0] and episode["l"].tolist() == [2]
    assert episode["s"].tolist() == [True] and episode["mask"].tolist() == [True]
    assert rollout.poll(lambda env: obs(0)) == []
    rollout.reset_done(0)
    [infer2] = messages(rollout.poll(lambda env: obs(0)))
    assert infer2["step_ids"].tolist() == [0]
    assert infer2["data"]["states"]["t"].tolist() == [[0.0]]
    assert rollout.envs[0].episodes == 1 and rollout.envs[0].last_return == 2.0


def test_max_episode_steps_truncates_and_info_masks_only_ending_rows():
    rollout = Rollout(RolloutSettings(n_envs=2, max_episode_steps=2), Clock())
    connect(rollout, horizon=2)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=2)
    rollout.take_step(0)
    rollout.finish_step(0, 1.0, False, False, False, obs(1))
    rollout.take_step(0)
    rollout.finish_step(0, 1.0, False, False, False, obs(2))
    rollout.take_step(1)
    rollout.finish_step(1, 1.0, True, False, False, obs(1))
    [feedback] = messages(rollout.poll(lambda env: None))
    assert feedback["data"]["truncated"].tolist() == [True, False]
    assert feedback["data"]["terminated"].tolist() == [False, True]
    assert feedback["data"]["info"]["episode"]["mask"].tolist() == [True, True]
    assert feedback["data"]["info"]["episode"]["l"].tolist() == [2, 1]


def test_replan_steps_runs_only_a_prefix_of_each_chunk():
    rollout = Rollout(RolloutSettings(n_envs=1, replan_steps=2), Clock())
    connect(rollout, horizon=5)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=5)
    rollout.take_step(0)
    assert not rollout.finish_step(0, 1.0, False, False, False, obs(1))
    rollout.take_step(0)
    assert rollout.finish_step(0, 1.0, False, False, False, obs(2))


@pytest.mark.parametrize(
    ("settings", "frame", "problem"),
    [
        ({"action_horizon": 4}, action_frame([0], 3, 1), "horizon 3, but the expected horizon is 4"),
        ({"action_width": 2}, action_frame([0], 3, 1), "width 1 per step, but the expected width is 2"),
        ({"min_action_width": 3}, action_frame([0], 3, 2), "the configured actions read 3 values"),
    ],
)
def test_actions_that_do_not_fit_the_configuration_are_a_mismatch(settings, frame, problem):
    rollout = Rollout(RolloutSettings(n_envs=1, **settings), Clock())
    rollout.on_connected(1)
    rollout.on_frame(1, metadata_frame())
    rollout.poll(lambda env: obs(0))
    result = rollout.on_frame(1, frame)
    # not a passing fault: every reconnect to this trainer meets it again (the driver retries slowly)
    assert result.kind == "mismatch" and problem in result.detail
    assert rollout.take_step(0) is None  # nothing reaches an actuator
    assert rollout.poll(lambda env: obs(0)) == []  # and nothing more is sent on that connection


def test_an_action_that_breaks_the_trainers_own_metadata_is_a_protocol_error():
    rollout = Rollout(RolloutSettings(n_envs=1), Clock())
    connect(rollout, horizon=4, width=2)
    rollout.poll(lambda env: obs(0))
    result = rollout.on_frame(1, action_frame([0], 3, 2))
    assert result.kind == "error" and "horizon 3, but the expected horizon is 4" in result.detail
    assert rollout.take_step(0) is None


def test_a_trainer_announcing_too_narrow_an_action_is_refused_at_metadata():
    rollout = Rollout(RolloutSettings(n_envs=1, min_action_width=6), Clock())
    rollout.on_connected(1)
    result = rollout.on_frame(1, metadata_frame(horizon=4, width=2))
    assert result.kind == "mismatch" and "action_dim: 2, but the configured actions read 6" in result.detail
    assert rollout.poll(lambda env: obs(0)) == []


def test_a_trainer_announcing_a_wider_action_than_the_actions_read_is_refused_at_metadata():
    rollout = Rollout(RolloutSettings(n_envs=1, min_action_width=2, refuse_wider=True), Clock())
    rollout.on_connected(1)
    result = rollout.on_frame(1, metadata_frame(horizon=4, width=6))
    assert result.kind == "mismatch"
    assert "action_dim: 6, but the configured actions read 2 values per step" in result.detail
    assert "set control.action_dim: 6" in result.detail  # how to mean it
    assert rollout.poll(lambda env: obs(0)) == []


def test_a_wider_action_is_accepted_when_the_configured_width_says_so():
    rollout = Rollout(RolloutSettings(n_envs=1, min_action_width=2, refuse_wider=True, action_width=6), Clock())
    connect(rollout, horizon=1, width=6)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=1, width=6)
    assert rollout.take_step(0).tolist() == [action_value(0, 0, j) for j in range(6)]
    rollout.on_disconnected(rollout.epoch)
    rollout.on_connected(rollout.epoch + 1)
    assert rollout.on_frame(rollout.epoch, metadata_frame(horizon=1, width=7)).kind == "mismatch"


def test_a_driver_that_applies_any_width_accepts_a_wider_action():
    rollout = Rollout(RolloutSettings(n_envs=1, min_action_width=2), Clock())
    connect(rollout, horizon=1, width=6)
    assert rollout.expected_width == 6


def test_the_announced_shape_wins_over_the_configured_one():
    rollout = Rollout(RolloutSettings(n_envs=1, action_horizon=8, action_width=7), Clock())
    connect(rollout, horizon=3, width=2)
    assert (rollout.expected_horizon, rollout.expected_width) == (3, 2)


def test_a_close_drops_held_feedback_and_running_chunks_and_the_next_connection_starts_with_an_infer():
    rollout = Rollout(RolloutSettings(n_envs=2), Clock())
    connect(rollout, horizon=3, features=["reuse-feedback-obs"])
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer)
    rollout.take_step(0)
    rollout.finish_step(0, 1.0, True, False, False, obs(1))  # env 0: terminal feedback pending
    rollout.take_step(1)  # env 1: mid-chunk
    assert rollout.on_disconnected(rollout.epoch) == (0, 1)
    assert rollout.take_step(1) is None
    assert rollout.poll(lambda env: obs(0)) == []
    rollout.reset_done(0)
    connect(rollout, horizon=3, features=["reuse-feedback-obs"])
    rollout.finish_step(1, 1.0, False, False, False, obs(1))  # env 1's last step reports after the close
    [first] = messages(rollout.poll(lambda env: obs(7)))
    assert first["message_type"] == "infer" and "reuse" not in first
    assert first["env_indices"].tolist() == [0, 1]
    assert first["step_ids"].tolist() == [0, 0]  # env 0's episode ended; env 1's continues at chunk 0


def test_frames_of_an_old_connection_are_ignored():
    rollout = Rollout(RolloutSettings(n_envs=1), Clock())
    connect(rollout)
    rollout.poll(lambda env: obs(0))
    assert rollout.on_frame(rollout.epoch - 1, action_frame([0], 3, 1)).kind == "ignored"


def test_pause_truncates_running_episodes_and_stops_new_chunks():
    rollout = Rollout(RolloutSettings(n_envs=1), Clock())
    connect(rollout, horizon=3)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer)
    rollout.take_step(0)
    rollout.set_paused(True)
    assert rollout.finish_step(0, 1.0, False, False, False, obs(1))
    [feedback] = messages(rollout.poll(lambda env: obs(1)))
    assert feedback["data"]["truncated"].tolist() == [True]
    rollout.reset_done(0)
    assert rollout.poll(lambda env: obs(0)) == []
    rollout.set_paused(False)
    assert messages(rollout.poll(lambda env: obs(0)))[0]["message_type"] == "infer"


def test_an_action_arriving_while_paused_runs_one_step_after_resuming_and_truncates():
    rollout = Rollout(RolloutSettings(n_envs=1), Clock())
    connect(rollout, horizon=3)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    rollout.set_paused(True)
    answer(rollout, infer)
    rollout.set_paused(False)
    rollout.take_step(0)
    assert rollout.finish_step(0, 1.0, False, False, False, obs(1))
    [feedback] = messages(rollout.poll(lambda env: None))
    assert feedback["data"]["truncated"].tolist() == [True]


def test_an_interrupted_step_cuts_the_chunk_without_ending_the_episode():
    rollout = Rollout(RolloutSettings(n_envs=1), Clock())
    connect(rollout, horizon=3)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer)
    rollout.take_step(0)
    assert rollout.finish_step(0, 1.0, False, False, False, obs(1), interrupted=True)
    feedback, infer2 = messages(rollout.poll(lambda env: obs(1)))
    assert feedback["data"]["truncated"].tolist() == [False] and feedback["data"]["terminated"].tolist() == [False]
    assert infer2["step_ids"].tolist() == [1]


# -- fresh episodes on every connection ------------------------------------------


def run_steps(rollout: Rollout, env: int, steps: int, t0: int = 0) -> None:
    for k in range(steps):
        rollout.take_step(env)
        rollout.finish_step(env, 1.0, False, False, False, obs(t0 + k + 1))


def test_with_fresh_episodes_every_env_is_reset_before_its_first_infer_at_startup():
    rollout = Rollout(RolloutSettings(n_envs=2, fresh_episodes=True), Clock())
    assert rollout.needs_reset(0) and rollout.needs_reset(1)
    connect(rollout)
    assert rollout.poll(lambda env: obs(0)) == []  # nobody may infer before its reset
    rollout.reset_done(1)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    assert infer["env_indices"].tolist() == [1]


def test_without_a_reset_procedure_the_first_observation_starts_the_episode():
    rollout = Rollout(RolloutSettings(n_envs=1, fresh_episodes=True, resets=False), Clock())
    assert not rollout.needs_reset(0)
    connect(rollout, horizon=3)
    [infer] = messages(rollout.poll(lambda env: obs(5)))
    answer(rollout, infer)
    run_steps(rollout, 0, 2, t0=5)
    rollout.on_disconnected(rollout.epoch)  # mid-episode: the next connection starts a new one, with no reset
    assert not rollout.needs_reset(0)
    env = rollout.envs[0]
    assert (env.episode_length, env.episode_return, env.step_id) == (0, 0.0, 0)


def test_with_fresh_episodes_a_close_mid_episode_resets_the_env_before_the_next_connection_uses_it():
    rollout = Rollout(RolloutSettings(n_envs=3, fresh_episodes=True, max_episode_steps=5), Clock())
    for env in range(3):
        rollout.reset_done(env)
    connect(rollout, horizon=2)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=2)
    run_steps(rollout, 0, 2)  # env 0: its chunk's feedback is pending, mid-episode
    rollout.take_step(1)  # env 1: a step in flight as the connection closes
    rollout.take_step(2)
    rollout.finish_step(2, 1.0, True, False, False, obs(1))  # env 2: terminal, feedback pending, resetting
    rollout.on_disconnected(rollout.epoch)
    assert rollout.needs_reset(0) and rollout.envs[0].episode_length == 0 and rollout.envs[0].step_id == 0
    assert not rollout.needs_reset(1)  # the robot is still taking its step
    assert rollout.envs[2].episodes == 1  # that episode did end; only its feedback was lost
    rollout.finish_step(1, 1.0, False, False, False, obs(1))  # the detached step reports: now env 1 restarts
    assert rollout.needs_reset(1) and rollout.envs[1].episode_length == 0
    assert rollout.envs[1].episodes == 0  # a cut episode is not counted as finished
    for env in range(3):
        rollout.reset_done(env)
    connect(rollout, horizon=4)
    [first] = messages(rollout.poll(lambda env: obs(0)))
    assert first["env_indices"].tolist() == [0, 1, 2] and first["step_ids"].tolist() == [0, 0, 0]
    answer(rollout, first, horizon=4)
    run_steps(rollout, 0, 4)
    # the time limit counts from the fresh start: 4 steps so far on this connection, not 6
    assert rollout.envs[0].episode_length == 4 and not rollout.needs_reset(0)


def test_an_env_already_at_a_fresh_start_is_not_reset_again_on_a_close():
    rollout = Rollout(RolloutSettings(n_envs=1, fresh_episodes=True), Clock())
    rollout.reset_done(0)
    connect(rollout)
    messages(rollout.poll(lambda env: obs(0)))  # an infer in flight: nothing of the episode ran
    rollout.on_disconnected(rollout.epoch)
    assert not rollout.needs_reset(0)


# -- scheduling: a deterministic timer-mode simulation ------------------------


@dataclass
class SimEnv:
    index: int
    reset_s: float = 0.0  # how long a reset takes
    silent: tuple[float, float] | None = None  # sensors silent in [start, end)
    t: int = 0
    reset_until: float | None = None
    chunk_ended_at: float | None = None
    waits: list[float] = field(default_factory=list)  # chunk end (non-terminal) -> next chunk start
    max_hold: float = 0.0


class Simulation:
    """Timer-mode stepping of probe-like envs against a trainer answering after ``latency``.

    It drives the core as the bridge's timer does (:class:`TimerSteps`): at a
    tick, sample the steps that are due, send what is due, publish the next
    steps; a chunk's first step goes out when the chunk arrives, between ticks.
    """

    def __init__(self, envs: list[SimEnv], horizon=4, dt=0.02, latency=0.005, deadline=30.0, features=()):
        self.clock = Clock()
        self.horizon, self.dt, self.latency = horizon, dt, latency
        self.envs = envs
        self.rollout = Rollout(
            RolloutSettings(n_envs=len(envs), feedback_deadline_s=deadline, batch_window_s=0.0), self.clock
        )
        self.features = features
        connect(self.rollout, horizon=horizon, features=features)
        self.inflight: tuple[float, list[int]] | None = None
        self.t_at_infer: dict[int, int] = {}
        self.feedback_rows = 0
        self.pending_since: dict[int, float] = {}
        self.max_phase_feedback = 0.0
        self.phase_feedback_since: float | None = None
        self.steps = TimerSteps(len(envs), dt)
        self.step_started: dict[int, float] = {}
        self.step_durations: list[float] = []  # publish -> sample, for every step that reported
        self.ticks = 0

    def silent(self, env: SimEnv) -> bool:
        return env.silent is not None and env.silent[0] <= self.clock.now < env.silent[1]

    def capture(self, i: int) -> ObservationRow | None:
        env = self.envs[i]
        if self.silent(env) or env.reset_until is not None:
            return None
        return obs(env.t)

    def run(self, seconds: float) -> None:
        ticks = int(seconds / self.dt)
        for _ in range(ticks):
            next_tick = round(self.clock.now + self.dt, 9)
            if self.inflight is not None and self.inflight[0] < next_tick:
                self.clock.now = self.inflight[0]
                self._deliver()
            self.clock.now = next_tick
            self._tick()
            self.ticks += 1

    def _publish(self, i: int) -> bool:
        if self.rollout.take_step(i) is None:
            return False
        self.envs[i].t += 1
        self.step_started[i] = self.clock.now
        self.steps.started(i, self.clock.now)
        return True

    def _deliver(self) -> None:
        _, envs = self.inflight
        self.inflight = None
        frame = action_frame(envs, self.horizon, 1)
        assert self.rollout.on_frame(self.rollout.epoch, frame).kind == "action"
        self.phase_feedback_since = self.clock.now
        for i in envs:
            env = self.envs[i]
            if env.chunk_ended_at is not None:
                env.waits.append(self.clock.now - env.chunk_ended_at)
                env.chunk_ended_at = None
            if not self.silent(env):
                self._publish(i)  # the first step goes out as the chunk arrives

    def _tick(self) -> None:
        now = self.clock.now
        self.steps.tick()
        for env in self.envs:
            i = env.index
            if self.rollout.step_in_flight(i) and self.steps.due(i, now):
                if self.silent(env):
                    continue
                self.step_durations.append(now - self.step_started.pop(i))
                terminated = env.t >= episode_length(i)
                if self.rollout.finish_step(i, 1.0, terminated, False, False, obs(env.t)):
                    self.pending_since[i] = now
                    if not terminated:
                        env.chunk_ended_at = now
            if self.rollout.needs_reset(i):
                if env.reset_until is None:
                    env.reset_until = now + env.reset_s
                if now >= env.reset_until:
                    env.t = 0
                    env.reset_until = None
                    self.rollout.reset_done(i)
        for message in messages(self.rollout.poll(self.capture)):
            self._check(message)
        for env in self.envs:
            if not self.silent(env):
                self._publish(env.index)

    def _check(self, message: dict) -> None:
        now = self.clock.now
        envs = message["env_indices"].tolist()
        if message["message_type"] == "feedback":
            self.max_phase_feedback = max(self.max_phase_feedback, now - (self.phase_feedback_since or now))
            self.phase_feedback_since = None
            data = message["data"]
            for row, i in enumerate(envs):
                t = int(data["obs"]["states"]["t"][row, 0])
                steps = t - self.t_at_infer.pop(i)
                assert 1 <= steps <= self.horizon
                assert data["rewards"][row] == steps  # the chunk sum
                assert bool(data["terminated"][row]) == (t == episode_length(i))  # terminal observation
                self.envs[i].max_hold = max(self.envs[i].max_hold, now - self.pending_since.pop(i))
                self.feedback_rows += 1
        else:
            assert self.inflight is None
            self.inflight = (now + self.latency, envs)
            reuse = message.get("reuse")
            sent = iter(message["data"]["states"]["t"][:, 0].tolist())
            for row, i in enumerate(envs):
                if reuse is not None and reuse[row]:
                    self.t_at_infer[i] = self.envs[i].t
                else:
                    self.t_at_infer[i] = int(next(sent))


def chunk_s(sim: Simulation) -> float:
    return sim.horizon * sim.dt


@pytest.mark.parametrize("features", [(), ("reuse-feedback-obs",)])
def test_a_robot_resetting_for_seconds_never_freezes_the_others_longer_than_one_chunk(features):
    envs = [SimEnv(0, reset_s=5.0), SimEnv(1, reset_s=0.0), SimEnv(2, reset_s=0.1), SimEnv(3, reset_s=1.3)]
    sim = Simulation(envs, horizon=4, features=features)
    sim.run(40.0)
    bound = chunk_s(sim) + sim.latency + 2 * sim.dt
    assert envs[1].waits and envs[2].waits  # episodes of 5 and 7 steps span several chunks of 4
    for env in envs:
        assert sim.rollout.envs[env.index].episodes >= 5
        assert max(env.waits, default=0.0) <= bound + 1e-9, (env.index, max(env.waits))
    # a held terminal feedback waits at most one chunk of a running env
    assert max(e.max_hold for e in envs) <= chunk_s(sim) + sim.latency + 2 * sim.dt + 1e-9
    assert sim.feedback_rows > 500


def test_an_env_whose_sensors_go_silent_does_not_stall_the_others_and_resumes():
    envs = [SimEnv(0, silent=(2.0, 12.0)), SimEnv(1), SimEnv(2, reset_s=0.5)]
    sim = Simulation(envs, horizon=3)
    sim.run(20.0)
    bound = chunk_s(sim) + sim.latency + 2 * sim.dt
    assert max(envs[1].waits) <= bound + 1e-9
    assert max(envs[2].waits) <= bound + 1e-9
    resumed = sim.rollout.envs[0].steps_total
    assert resumed > (20.0 - 10.0) / sim.dt * 0.5  # env 0 stepped after its sensors came back


def test_held_feedback_goes_out_before_the_deadline_even_if_every_running_env_is_stuck():
    # env 1 holds a chunk but its sensors are silent for 100 s; env 0 terminates
    # and resets slowly; the feedback must still go out within the deadline.
    envs = [SimEnv(0, reset_s=200.0), SimEnv(1, silent=(0.05, 100.0))]
    sim = Simulation(envs, horizon=10, deadline=5.0)
    sim.run(30.0)
    assert sim.max_phase_feedback <= 5.0 + sim.dt + 1e-9
    assert sim.rollout.connection.phase in (Phase.INFER, Phase.FEEDBACK)


def test_the_deadline_cuts_long_chunks_so_the_trainer_never_times_out():
    envs = [SimEnv(0)]
    sim = Simulation(envs, horizon=1000, dt=0.1, deadline=2.0)
    sim.run(20.0)
    assert sim.feedback_rows >= 8
    assert sim.max_phase_feedback <= 2.0 + 2 * sim.dt


@pytest.mark.parametrize(("n", "resets"), list(itertools.product([1, 2, 5], [(0.0,), (0.0, 0.7, 3.0)])))
def test_ragged_episodes_and_resets_keep_every_invariant(n, resets):
    envs = [SimEnv(i, reset_s=resets[i % len(resets)]) for i in range(n)]
    sim = Simulation(envs, horizon=3, features=("reuse-feedback-obs",))
    sim.run(15.0)
    bound = chunk_s(sim) + sim.latency + 2 * sim.dt
    for env in envs:
        assert max(env.waits, default=0.0) <= bound + 1e-9
        assert sim.rollout.envs[env.index].episodes >= 3


def test_a_step_in_flight_when_the_connection_drops_still_counts_and_can_end_the_episode():
    rollout = Rollout(RolloutSettings(n_envs=1), Clock())
    connect(rollout, horizon=3)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer)
    rollout.take_step(0)
    rollout.finish_step(0, 1.0, False, False, False, obs(1))
    rollout.take_step(0)  # the robot is executing this step when the connection drops
    assert rollout.on_disconnected(rollout.epoch) == (0,)
    connect(rollout, horizon=3)
    assert rollout.poll(lambda env: obs(2)) == []  # mid-step: no observation to start a chunk from yet
    assert rollout.step_in_flight(0)
    assert not rollout.finish_step(0, 1.0, True, False, False, obs(2))  # terminal, but nothing to feed back
    assert rollout.needs_reset(0) and rollout.envs[0].episodes == 1 and rollout.envs[0].last_return == 2.0
    assert rollout.poll(lambda env: obs(2)) == []  # resetting
    rollout.reset_done(0)
    [infer2] = messages(rollout.poll(lambda env: obs(0)))
    assert infer2["step_ids"].tolist() == [0] and infer2["data"]["states"]["t"].tolist() == [[0.0]]


def test_a_failed_robot_truncates_its_episode_at_the_last_reported_step():
    rollout = Rollout(RolloutSettings(n_envs=1), Clock())
    connect(rollout, horizon=4)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=4)
    for t in (1, 2):
        rollout.take_step(0)
        rollout.finish_step(0, 1.0, False, False, False, obs(t))
    rollout.take_step(0)  # step 3 never reports: the robot died
    assert rollout.fail_env(0)
    assert not rollout.step_in_flight(0) and rollout.take_step(0) is None
    [feedback] = messages(rollout.poll(lambda env: None))
    data = feedback["data"]
    # no transition spans the failure: the observation and reward of the steps that reported
    assert data["obs"]["states"]["t"].tolist() == [[2.0]]
    assert data["rewards"].tolist() == [2.0]
    assert data["truncated"].tolist() == [True] and data["terminated"].tolist() == [False]
    assert data["info"]["episode"]["l"].tolist() == [2]
    assert rollout.needs_reset(0)


def test_a_robot_failing_in_the_first_step_of_a_chunk_freezes_it_until_the_connection_goes():
    rollout = Rollout(RolloutSettings(n_envs=2), Clock())
    connect(rollout, horizon=4)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=4)
    rollout.take_step(0)
    assert not rollout.fail_env(0)  # nothing to feed back: a feedback needs one reported step
    assert rollout.take_step(0) is None  # and the frozen chunk is not run on
    assert rollout.on_disconnected(rollout.epoch) == (0, 1)
    rollout.reset_done(0)
    connect(rollout, horizon=4)
    [infer2] = messages(rollout.poll(lambda env: obs(0)))
    assert infer2["env_indices"].tolist() == [0, 1] and infer2["step_ids"].tolist() == [0, 0]


@pytest.mark.parametrize("horizon", [1, 5])
def test_timer_mode_takes_one_step_per_tick_when_the_trainer_answers_in_time(horizon):
    envs = [SimEnv(0), SimEnv(1), SimEnv(2, reset_s=0.3)]
    sim = Simulation(envs, horizon=horizon, dt=0.02, latency=0.014, features=("reuse-feedback-obs",))
    sim.run(20.0)
    for env in envs[:2]:  # (the waiting for env 2's resets is not stepping)
        assert sim.rollout.envs[env.index].steps_total >= 0.97 * sim.ticks, (env.index, sim.ticks)
    # a step's action acts for a part of a period before it is sampled, and no step spans more than a tick
    assert min(sim.step_durations) >= MIN_STEP_FRACTION * sim.dt - 1e-9
    assert max(sim.step_durations) <= sim.dt + 1e-9


@pytest.mark.parametrize("horizon", [1, 5])
def test_a_late_answer_makes_the_first_step_of_a_chunk_last_longer_never_a_sliver_of_a_period(horizon):
    envs = [SimEnv(0), SimEnv(1)]
    sim = Simulation(envs, horizon=horizon, dt=0.02, latency=0.017)
    sim.run(20.0)
    assert min(sim.step_durations) >= MIN_STEP_FRACTION * sim.dt - 1e-9
    assert max(sim.step_durations) <= (1 + MIN_STEP_FRACTION) * sim.dt + 1e-9
    for env in envs:  # each chunk's first step spans two ticks: at worst (H=1) one step per two ticks
        assert sim.rollout.envs[env.index].steps_total >= 0.49 * sim.ticks


def test_timer_steps_wait_a_quarter_period_and_hold_the_command_only_during_the_tick_that_asked():
    steps = TimerSteps(2, period_s=0.02)
    steps.tick()
    assert steps.due(0, 0.0)  # no step yet
    steps.asked(0)
    assert steps.awaiting_answer(0) and not steps.awaiting_answer(1)
    steps.started(0, 0.004)
    assert not steps.due(0, 0.0089) and steps.due(0, 0.009)
    steps.tick()
    assert not steps.awaiting_answer(0)  # an answer not there by the next tick is late: the env idles


# -- a person in the loop ------------------------------------------------------------------


def test_a_feedback_says_which_steps_ran_something_else_and_what_each_step_executed():
    rollout = Rollout(RolloutSettings(n_envs=2, interventions=True), Clock())
    connect(rollout, horizon=3, width=2)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=3, width=2)
    person = np.array([-1.0, -2.0])
    for k in range(3):
        for env in (0, 1):
            action = rollout.take_step(env)
            if env == 0 and k == 1:  # env 0's second step: a person's command ran instead
                rollout.replaced(env, person, person=True)
            elif env == 1 and k == 2:
                rollout.replaced(env, action * 0, person=False)  # an idle
            rollout.finish_step(env, 1.0, False, False, False, obs(k + 1))
    [feedback, _] = messages(rollout.poll(lambda env: obs(9)))
    intervention = feedback["data"]["info"]["intervention"]
    assert intervention["active"].tolist() == [[False, True, False], [False, False, True]]
    chunk = [[[action_value(k, e, j) for j in range(2)] for k in range(3)] for e in (0, 1)]
    expected = np.array(chunk, dtype="<f4")
    expected[0, 1] = person
    expected[1, 2] = 0.0
    assert intervention["action"].dtype == np.dtype("<f4") and np.array_equal(intervention["action"], expected)
    assert feedback["data"]["rewards"].tolist() == [3.0, 3.0]  # the person's steps count like any other
    assert [rollout.envs[e].person_steps for e in (0, 1)] == [1, 0]


def test_a_chunk_ended_early_feeds_back_its_unrun_steps_as_inactive_zeros():
    rollout = Rollout(RolloutSettings(n_envs=1, interventions=True), Clock())
    connect(rollout, horizon=4)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=4)
    rollout.take_step(0)
    rollout.finish_step(0, 0.0, True, False, False, obs(1))  # terminated at its first step
    [feedback] = messages(rollout.poll(lambda env: None))
    intervention = feedback["data"]["info"]["intervention"]
    assert intervention["active"].tolist() == [[False] * 4]
    assert intervention["action"][0, :, 0].tolist() == [action_value(0, 0, 0), 0.0, 0.0, 0.0]
    assert "episode" in feedback["data"]["info"]


def test_without_interventions_the_info_carries_no_intervention_key():
    rollout = Rollout(RolloutSettings(n_envs=1), Clock())
    connect(rollout, horizon=1)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    answer(rollout, infer, horizon=1)
    rollout.take_step(0)
    rollout.finish_step(0, 0.0, False, False, False, obs(1))
    [feedback, _] = messages(rollout.poll(lambda env: obs(2)))
    assert feedback["data"]["info"] == {}


def test_a_chunk_asked_for_before_a_person_moved_the_robot_may_not_be_run_by_the_policy():
    rollout = Rollout(RolloutSettings(n_envs=1, interventions=True), Clock())
    connect(rollout, horizon=2)
    [infer] = messages(rollout.poll(lambda env: obs(0)))
    assert rollout.policy_may_act(0)
    rollout.person_moved(0)  # the person drives while the answer is on its way
    assert not rollout.policy_may_act(0)
    answer(rollout, infer, horizon=2)
    assert not rollout.policy_may_act(0)  # computed for a state the person changed
    rollout.take_step(0)
    rollout.replaced(0, np.zeros(1), person=False)  # the driver idles it ...
    rollout.cut(0)  # ... and ends it after this step
    assert rollout.finish_step(0, 0.0, False, False, False, obs(1))
    [feedback, infer2] = messages(rollout.poll(lambda env: obs(2)))  # asked from an observation after the release
    assert feedback["data"]["info"]["intervention"]["active"].tolist() == [[True, False]]
    assert not rollout.policy_may_act(0)  # still the stale chunk's turn until the fresh one arrives
    answer(rollout, infer2, horizon=2)
    assert rollout.policy_may_act(0)
