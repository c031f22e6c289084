"""The trainer-side protocol core: each rule a PlugRL server enforces, broken and kept, driven without I/O."""

from __future__ import annotations

import numpy as np
import pytest

from plugrl_ros.protocol.codec import packb
from plugrl_ros.protocol.messages import REUSE_FEEDBACK_OBS
from plugrl_ros.protocol.server_messages import EpisodeCount, Feedback, Infer, Resync, Rule, episode_counts, info_splits
from plugrl_ros.protocol.trainer_connection import ServerPhase, TrainerConnection


def observation(n: int, dim: int = 2, states_dtype: str = "<f8", text_as_list: bool = False) -> dict:
    text = ["go"] * n
    return {
        "images": {},
        "states": {"s": np.zeros((n, dim), dtype=states_dtype)},
        "text": text if text_as_list else np.array(text, dtype="<U2").reshape(n),
    }


def infer(envs, reuse=None, rows=None, step_ids=None, raw_reuse=None) -> bytes:
    n_rows = len(envs) - sum(reuse or []) if rows is None else rows
    message = {
        "message_type": "infer",
        "data": observation(n_rows),
        "env_indices": np.asarray(envs, dtype="<i8"),
        "step_ids": np.zeros(len(envs), dtype="<i8") if step_ids is None else step_ids,
    }
    if reuse is not None:
        message["reuse"] = np.asarray(reuse, dtype=bool)
    if raw_reuse is not None:
        message["reuse"] = raw_reuse
    return packb(message)


def feedback(envs, done=None, info=None, rewards=None, **data_extra) -> bytes:
    m = len(envs)
    data = {
        "obs": observation(m),
        "rewards": np.ones(m, dtype="<f4") if rewards is None else rewards,
        "terminated": np.asarray(done or [False] * m, dtype=bool),
        "truncated": np.zeros(m, dtype=bool),
        "info": {} if info is None else info,
    }
    data.update(data_extra)
    return packb(
        {
            "message_type": "feedback",
            "env_indices": np.asarray(envs, dtype="<i8"),
            "step_ids": np.zeros(m, dtype="<i8"),
            "data": data,
        }
    )


def opened(strict: bool = True, reuse: bool = False, n_envs: int | None = None) -> TrainerConnection:
    conn = TrainerConnection(strict=strict, n_envs=n_envs)
    conn.send_metadata({"protocol_version": 1, "features": [REUSE_FEEDBACK_OBS] if reuse else []})
    return conn


def cycle(conn: TrainerConnection, envs, done=None, info=None) -> Feedback:
    """One infer (answered) and its feedback for the same envs."""
    conn.receive(infer(envs))
    conn.answer(np.zeros((2, len(envs), 1), dtype="<f4"))
    return conn.receive(feedback(envs, done, info))


def resync(conn: TrainerConnection, frame: bytes | str) -> Resync:
    with pytest.raises(Resync) as raised:
        conn.receive(frame)
    assert conn.phase is ServerPhase.CLOSED  # a resync ends the connection and what it knew
    return raised.value


# -- metadata first, frames, envelope ------------------------------------------------


def test_a_client_speaking_before_the_metadata_is_resynced():
    conn = TrainerConnection()
    assert resync(conn, infer([0])).problem.rule is Rule.ALTERNATION
    conn = opened()
    assert isinstance(conn.receive(infer([0])), Infer)


def test_a_text_frame_or_garbage_is_resynced():
    assert resync(opened(), "hello").problem.rule is Rule.FRAME
    assert resync(opened(), b"\xc1").problem.rule is Rule.ENVELOPE
    bad_array = packb(
        {"message_type": "infer", "x": {b"__ndarray__": True, b"data": b"", b"dtype": "|O8", b"shape": []}}
    )
    assert resync(opened(), bad_array).problem.rule is Rule.ARRAYS


def test_a_message_without_a_required_key_is_resynced():
    no_indices = packb({"message_type": "infer", "data": observation(1), "step_ids": np.zeros(1, "<i8")})
    problem = resync(opened(), no_indices).problem
    assert problem.rule is Rule.ENVELOPE and "env_indices" in problem.detail
    unknown = packb({"message_type": "action", "data": {}})
    assert "expected 'infer'" in resync(opened(), unknown).problem.detail


def test_metadata_features_decide_what_the_client_may_use():
    assert opened(reuse=True).reuse_offered
    assert not opened(reuse=False).reuse_offered


# -- alternation -----------------------------------------------------------------------


def test_infer_and_feedback_alternate():
    conn = opened()
    cycle(conn, [0])
    cycle(conn, [0])
    assert (conn.infers, conn.feedbacks) == (2, 2)


def test_two_infers_in_a_row_are_resynced():
    conn = opened()
    conn.receive(infer([0]))
    conn.answer(np.zeros((1, 1, 1)))
    raised = resync(conn, infer([1]))
    assert raised.problem.rule is Rule.ALTERNATION and "a second infer" in raised.problem.detail
    assert raised.kind == "infer"


def test_a_feedback_first_or_twice_is_resynced():
    raised = resync(opened(), feedback([0]))
    assert raised.problem.rule is Rule.ALTERNATION and "began with a feedback" in raised.problem.detail
    conn = opened()
    cycle(conn, [0])
    assert "no infer since feedback 1" in resync(conn, feedback([0])).problem.detail


def test_a_client_speaking_before_the_action_is_resynced():
    conn = opened()
    conn.receive(infer([0]))
    assert resync(conn, feedback([0])).problem.rule is Rule.ALTERNATION


def test_the_action_answers_the_pending_infer_in_its_order():
    conn = opened()
    conn.receive(infer([3, 1]))
    action = conn.answer(np.zeros((4, 2, 1), dtype="<f4"))
    assert action["message_type"] == "action"
    assert action["data"]["env_ids"].tolist() == [3, 1]
    assert conn.phase is ServerPhase.AWAIT_FEEDBACK
    with pytest.raises(AssertionError):
        conn.answer(np.zeros((4, 2, 1)))  # no infer is pending any more


# -- env sets --------------------------------------------------------------------------


def test_a_feedback_only_for_envs_holding_an_action():
    conn = opened()
    conn.receive(infer([0, 1]))
    conn.answer(np.zeros((1, 2, 1)))
    conn.receive(feedback([1]))  # a subset: fine (the env sets need not match)
    assert set(conn.holding) == {0}
    conn.receive(infer([1]))  # env 1 holds none again
    conn.answer(np.zeros((1, 1, 1)))
    raised = resync(conn, feedback([0, 7]))
    assert raised.problem.rule is Rule.ENV_SETS and "env 7 holds no action" in raised.problem.detail


def test_an_infer_only_for_envs_holding_none():
    conn = opened()
    conn.receive(infer([0, 1]))
    conn.answer(np.zeros((1, 2, 1)))
    conn.receive(feedback([0]))
    raised = resync(conn, infer([0, 1]))
    assert raised.problem.rule is Rule.ENV_SETS and "env 1 still holds the action of infer 1" in raised.problem.detail


@pytest.mark.parametrize(
    ("envs", "detail"),
    [([], "at least one env"), ([2, 2], "repeat an env"), ([-1], "negative"), ([0, 5], "not below n_envs 4")],
)
def test_env_indices_are_unique_non_negative_and_in_range(envs, detail):
    raised = resync(opened(n_envs=4), infer(envs))
    assert raised.problem.rule is Rule.ENV_SETS and detail in raised.problem.detail
    assert isinstance(opened(n_envs=4).receive(infer([0, 3])), Infer)


def test_a_lenient_connection_reports_and_goes_on():
    conn = opened(strict=False)
    conn.receive(infer([0]))
    conn.answer(np.zeros((1, 1, 1)))
    received = conn.receive(feedback([0, 7]))
    assert [p.rule for p in received.violations] == [Rule.ENV_SETS]
    assert conn.phase is ServerPhase.AWAIT_INFER  # still in step
    assert not conn.holding


# -- reuse -----------------------------------------------------------------------------


def test_reuse_only_when_offered():
    conn = opened(reuse=False)
    cycle(conn, [0])
    raised = resync(conn, infer([0], reuse=[True]))
    assert raised.problem.rule is Rule.REUSE and "did not offer" in raised.problem.detail
    conn = opened(reuse=True)
    cycle(conn, [0])
    assert conn.receive(infer([0], reuse=[True])).reuse == (True,)


def test_reuse_only_after_a_non_terminal_feedback_on_this_connection():
    conn = opened(reuse=True)
    assert "no feedback on this connection" in resync(conn, infer([0], reuse=[True])).problem.detail
    conn = opened(reuse=True)
    cycle(conn, [0, 1], done=[True, False])
    raised = resync(conn, infer([0, 1], reuse=[True, True]))
    assert raised.problem.rule is Rule.REUSE and "env 0 is marked reuse after a terminal feedback" in str(raised)
    conn = opened(reuse=True)
    cycle(conn, [0, 1], done=[True, False])
    assert conn.receive(infer([0, 1], reuse=[False, True])).reuse == (False, True)


def test_data_holds_only_the_rows_not_reused():
    conn = opened(reuse=True)
    cycle(conn, [0, 1])
    raised = resync(conn, infer([0, 1], reuse=[True, False], rows=2))
    assert raised.problem.rule is Rule.REUSE and "reuse leaves 1 rows not reused" in raised.problem.detail
    conn = opened(reuse=True)
    cycle(conn, [0, 1])
    every_row_reused = conn.receive(infer([1, 0], reuse=[True, True]))
    assert every_row_reused.observation.rows == 0


def test_unusable_reuse_flags_are_resynced():
    conn = opened(reuse=True, strict=False)
    cycle(conn, [0])
    raised = resync(conn, infer([0], rows=1, raw_reuse=np.zeros((1, 2), dtype=bool)))
    assert raised.problem.rule is Rule.ARRAYS and "reuse" in raised.problem.detail


# -- arrays and step_ids ---------------------------------------------------------------


def test_step_ids_must_be_signed_ints_of_the_right_length():
    raised = resync(opened(), infer([0, 1], step_ids=np.zeros(2, dtype="<f8")))
    assert raised.problem.rule is Rule.ARRAYS and "step_ids" in raised.problem.detail
    raised = resync(opened(), infer([0, 1], step_ids=np.zeros(3, dtype="<i8")))
    assert raised.problem.rule is Rule.ARRAYS
    ok = opened().receive(infer([0, 1], step_ids=np.asarray([0, 4], dtype="<i8")))
    assert ok.step_ids == (0, 4) and not ok.deviations


def test_another_int_width_is_a_deviation_a_server_accepts():
    received = opened().receive(infer([0], step_ids=np.zeros(1, dtype="<i4")))
    assert received.step_ids == (0,) and not received.violations
    assert [p.rule for p in received.deviations] == [Rule.ARRAYS]


def test_rewards_must_be_finite_floats_and_f8_is_only_a_note():
    conn = opened()
    conn.receive(infer([0]))
    conn.answer(np.zeros((1, 1, 1)))
    assert resync(conn, feedback([0], rewards=np.asarray([np.nan], "<f4"))).problem.rule is Rule.ARRAYS
    conn = opened()
    conn.receive(infer([0]))
    conn.answer(np.zeros((1, 1, 1)))
    received = conn.receive(feedback([0], rewards=np.asarray([2.0], "<f8")))
    assert received.rewards.tolist() == [2.0]
    assert [p.note for p in received.deviations] == [True]


# -- observations ----------------------------------------------------------------------


def test_every_observation_array_shares_the_leading_dimension():
    raised = resync(opened(), infer([0, 1], rows=3))
    assert raised.problem.rule is Rule.OBSERVATION and "data has 3 rows, env_indices has 2" in raised.problem.detail
    bad = observation(2)
    bad["images"] = {"cam": np.zeros((1, 2, 2, 3), dtype="|u1")}
    frame = packb({"message_type": "infer", "data": bad, "env_indices": np.arange(2), "step_ids": np.zeros(2, "<i8")})
    assert "leading dimensions differ" in resync(opened(), frame).problem.detail


def test_an_empty_text_array_of_another_dtype_is_a_deviation():
    conn = opened(reuse=True)
    cycle(conn, [0])
    message = {
        "message_type": "infer",
        "data": {"images": {}, "states": {}, "text": np.asarray([])},  # numpy's empty list: <f8
        "env_indices": np.arange(1, dtype="<i8"),
        "step_ids": np.zeros(1, "<i8"),
        "reuse": np.ones(1, dtype=bool),
    }
    received = conn.receive(packb(message))
    assert not received.violations and [p.rule for p in received.deviations] == [Rule.OBSERVATION]
    message["data"]["text"] = np.zeros(1)  # a non-empty one is still refused
    del message["reuse"]
    conn = opened()
    assert resync(conn, packb(message)).problem.rule is Rule.OBSERVATION


def test_observation_keys_are_exactly_images_states_text():
    extra = observation(1)
    extra["depth"] = {}
    frame = packb({"message_type": "infer", "data": extra, "env_indices": np.arange(1), "step_ids": np.zeros(1, "<i8")})
    assert resync(opened(), frame).problem.rule is Rule.OBSERVATION


def test_state_width_and_text_form_are_deviations():
    message = {
        "message_type": "infer",
        "data": observation(2, states_dtype="<f4", text_as_list=True),
        "env_indices": np.arange(2, dtype="<i8"),
        "step_ids": np.zeros(2, "<i8"),
    }
    received = opened().receive(packb(message))
    assert not received.violations
    assert sorted(p.note for p in received.deviations) == [False, True]


# -- info (§5.4 of the protocol, docs/protocol.md) -------------------------------------


def test_an_info_that_cannot_be_split_per_env_is_resynced():
    conn = opened()
    conn.receive(infer([0, 1]))
    conn.answer(np.zeros((1, 2, 1)))
    raised = resync(conn, feedback([0, 1], info={"task": "pick"}))
    assert raised.problem.rule is Rule.INFO and "cannot be split per env" in raised.problem.detail


def test_a_splittable_info_is_accepted():
    episode = {"r": np.ones(2, "<f4"), "l": np.ones(2, "<i8"), "mask": np.asarray([True, False])}
    fed = cycle(opened(), [0, 1], done=[True, False], info={"episode": episode, "task": "pick"})
    assert fed.info["task"] == "pick" and not fed.violations
    assert not cycle(opened(), [0, 1], info={"success": np.zeros(2, bool)}).violations
    assert not cycle(opened(), [0], info={"task": "pick"}).violations  # one env: nothing to split


@pytest.mark.parametrize(
    ("info", "m", "splits"),
    [
        ({}, 3, True),
        ({"task": "pick"}, 1, True),
        ({"task": "pick"}, 2, False),
        ({"x": [1, 2]}, 2, False),  # a msgpack list is not an array
        ({"x": np.zeros(3)}, 2, False),  # the wrong length
        ({"x": np.zeros((2, 5))}, 2, True),
        ({"a": {"b": np.zeros(2)}}, 2, True),  # one map down
        ({"a": {"b": {"c": np.zeros(2)}}}, 2, False),  # two maps down is too deep
    ],
)
def test_info_splits(info, m, splits):
    assert info_splits(info, m) is splits


def test_episode_counts_are_read_on_ended_masked_rows_only():
    episode = {
        "r": np.asarray([1.5, 2.0, 3.0], "<f4"),
        "l": np.asarray([4, 5, 6], "<i8"),
        "s": np.asarray([True, False, True]),
        "mask": np.asarray([True, True, False]),
    }
    ended = np.asarray([True, False, True])
    assert episode_counts({"episode": episode}, ended) == [EpisodeCount(1.5, 4, True), None, None]
    assert episode_counts({}, ended) == [None] * 3
    short = {"r": np.ones(2), "mask": np.ones(2, bool)}  # no l, no s: 0 and False
    assert episode_counts({"episode": short}, np.ones(2, bool)) == [EpisodeCount(1.0, 0, False)] * 2


@pytest.mark.parametrize(
    ("episode", "detail"),
    [
        ([1, 2], "must be a map"),
        ({"r": np.ones(2)}, "must hold r and mask"),
        ({"r": np.ones(3), "mask": np.ones(3, bool)}, "must hold r and mask"),
        ({"r": ["a", "b"], "mask": np.ones(2, bool)}, "must hold r and mask"),
        ({"r": np.ones(2), "l": [float("inf"), 3], "mask": np.ones(2, bool)}, r"l\[0\] is inf"),  # a msgpack list
        ({"r": np.ones(2), "l": np.asarray([np.inf, 3.0]), "mask": np.ones(2, bool)}, r"l\[0\] is inf"),
        ({"r": np.ones(2), "l": np.asarray([2.5, 3.0]), "mask": np.ones(2, bool)}, "whole number"),
        ({"r": np.asarray([np.nan, 1.0]), "mask": np.ones(2, bool)}, r"r\[0\] is nan"),
    ],
)
def test_an_unreadable_episode_count_is_a_resync_naming_what_is_wrong(episode, detail):
    with pytest.raises(Resync, match=detail) as raised:
        episode_counts({"episode": episode}, np.ones(2, bool))
    assert raised.value.problem.rule is Rule.INFO


def test_close_forgets_every_env():
    conn = opened(reuse=True)
    cycle(conn, [0])
    conn.receive(infer([1]))
    assert conn.may_reuse(0) and conn.holding
    conn.close()
    assert not conn.may_reuse(0) and not conn.holding and conn.phase is ServerPhase.CLOSED
