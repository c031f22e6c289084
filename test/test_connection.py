"""The sans-I/O connection: metadata first, alternation, env sets, reuse, and what a close drops."""

from __future__ import annotations

import numpy as np
import pytest

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.connection import SAME_AS_FEEDBACK, Connection, Phase
from plugrl_ros.protocol.errors import FatalServerError, ProtocolError, ProtocolMisuse
from plugrl_ros.protocol.messages import ObservationRow


def metadata(**data) -> bytes:
    return codec.packb({"message_type": "metadata", "data": data})


def action(env_ids, horizon=2, width=1, with_env_ids=True, dtype="<f4") -> bytes:
    values = np.zeros((horizon, len(env_ids), width), dtype=dtype)
    data = {"action": values}
    if with_env_ids:
        data["env_ids"] = np.asarray(env_ids, dtype="<i8")
    return codec.packb({"message_type": "action", "data": data})


def row(t: float = 0.0, text: str = "") -> ObservationRow:
    return ObservationRow(images={"cam": np.full((2, 3, 3), int(t), np.uint8)}, states={"t": np.array([t])}, text=text)


def decoded(outgoing) -> dict:
    return codec.unpackb(outgoing.encode())


def ready(features=()) -> Connection:
    conn = Connection()
    conn.receive(metadata(features=list(features)))
    return conn


def test_nothing_may_be_sent_before_the_metadata():
    conn = Connection()
    with pytest.raises(ProtocolMisuse, match="await metadata"):
        conn.infer([0], [0], [row()])
    assert conn.phase is Phase.AWAIT_METADATA


def test_metadata_keys_are_advisory_and_malformed_ones_are_ignored():
    conn = Connection()
    meta = conn.receive(metadata(action_horizon=0, action_dim="3", features="x", protocol_version=1, extra={"a": 1}))
    assert meta.action_horizon is None and meta.action_dim is None
    assert meta.features == frozenset()
    assert set(meta.ignored) == {"action_horizon", "action_dim", "features"}
    assert meta.protocol_version == 1
    assert conn.phase is Phase.INFER


def test_metadata_of_the_wrong_type_is_a_protocol_error_naming_the_field():
    conn = Connection()
    with pytest.raises(ProtocolError, match="message_type: expected 'metadata', got 'action'"):
        conn.receive(codec.packb({"message_type": "action", "data": {}}))


def test_a_text_frame_is_fatal():
    conn = ready()
    with pytest.raises(FatalServerError, match="text frame"):
        conn.receive("Traceback (most recent call last): ...")
    assert conn.phase is Phase.CLOSED


def test_infer_then_feedback_strictly_alternate():
    conn = ready()
    conn.infer([0], [0], [row()])
    with pytest.raises(ProtocolMisuse):
        conn.infer([1], [0], [row()])
    with pytest.raises(ProtocolMisuse):
        conn.feedback([0], [0], [row()], [1.0], [False], [False], {})
    conn.receive(action([0]))
    with pytest.raises(ProtocolMisuse, match="expects 'feedback'"):
        conn.infer([1], [0], [row()])
    conn.feedback([0], [0], [row()], [1.0], [False], [False], {})
    assert conn.phase is Phase.INFER


def test_an_env_holding_an_action_cannot_be_in_an_infer_and_one_holding_none_not_in_a_feedback():
    conn = ready()
    conn.infer([0, 1], [0, 0], [row(), row()])
    conn.receive(action([0, 1]))
    conn.feedback([0], [0], [row()], [1.0], [False], [False], {})
    with pytest.raises(ProtocolMisuse, match="env 1 is in an infer while it still holds an action"):
        conn.infer([0, 1], [1, 0], [row(), row()])
    conn.infer([0], [1], [row()])
    conn.receive(action([0]))
    with pytest.raises(ProtocolMisuse, match="env 2 is in a feedback but holds no action"):
        conn.feedback([2], [0], [row()], [1.0], [False], [False], {})


def test_env_indices_must_be_unique_and_the_batch_nonempty():
    conn = ready()
    with pytest.raises(ProtocolMisuse, match="not unique"):
        conn.infer([0, 0], [0, 0], [row(), row()])
    with pytest.raises(ProtocolMisuse, match="at least one env"):
        conn.infer([], [], [])


def test_action_env_ids_must_match_the_infer_in_order():
    conn = ready()
    conn.infer([3, 1], [0, 0], [row(), row()])
    with pytest.raises(ProtocolError, match=r"env_ids: \[1, 3\] does not match"):
        conn.receive(action([1, 3]))


def test_action_without_env_ids_is_read_as_the_infers_envs():
    conn = ready()
    conn.infer([3, 1], [0, 0], [row(), row()])
    chunk = conn.receive(action([3, 1], with_env_ids=False))
    assert chunk.env_ids == (3, 1)
    assert conn.holding == {1, 3}


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        (np.zeros((0, 1, 2), np.float32), "horizon 0"),
        (np.zeros((2, 2, 2), np.float32), r"shape \[2, 2, 2\] is not \[H, 1, \*da\]"),
        (np.zeros((2,), np.float32), "is not"),
        (np.array([[[np.nan]]], np.float32), "NaN or infinite"),
        (np.array([[[np.inf]]], np.float64), "NaN or infinite"),
        (np.array([["a"]]), "not numeric"),
        (7.0, "must be an ndarray"),
    ],
)
def test_malformed_actions_are_refused_naming_the_field(values, problem):
    conn = ready()
    conn.infer([0], [0], [row()])
    frame = codec.packb({"message_type": "action", "data": {"env_ids": np.array([0]), "action": values}})
    with pytest.raises(ProtocolError, match=problem) as info:
        conn.receive(frame)
    assert info.value.field.startswith("action.data")


def test_a_decoded_action_is_a_private_float64_copy():
    conn = ready()
    conn.infer([0], [0], [row()])
    chunk = conn.receive(action([0], dtype=">f4"))
    assert chunk.actions.dtype == np.float64 and chunk.actions.flags.writeable


def test_reuse_is_sent_only_when_offered_and_substituted_otherwise():
    for offered in (True, False):
        conn = ready(["reuse-feedback-obs"] if offered else [])
        conn.infer([0, 1], [0, 0], [row(0), row(0)])
        conn.receive(action([0, 1]))
        conn.feedback([0, 1], [0, 0], [row(5), row(7)], [1.0, 1.0], [False, False], [False, False], {})
        message = decoded(conn.infer([0, 1], [1, 1], [SAME_AS_FEEDBACK, row(9)]))
        if offered:
            assert message["reuse"].tolist() == [True, False]
            assert message["reuse"].dtype.str == "|b1"
            assert message["data"]["states"]["t"].tolist() == [[9.0]]
        else:
            assert "reuse" not in message
            assert message["data"]["states"]["t"].tolist() == [[5.0], [9.0]]


def test_reuse_of_a_terminal_feedback_or_on_a_new_connection_is_refused():
    conn = ready(["reuse-feedback-obs"])
    conn.infer([0], [0], [row()])
    conn.receive(action([0]))
    conn.feedback([0], [0], [row(3)], [1.0], [True], [False], {})
    with pytest.raises(ProtocolMisuse, match="no reusable observation"):
        conn.infer([0], [0], [SAME_AS_FEEDBACK])
    fresh = ready(["reuse-feedback-obs"])
    with pytest.raises(ProtocolMisuse, match="no reusable observation"):
        fresh.infer([0], [0], [SAME_AS_FEEDBACK])


def test_an_infer_whose_rows_are_all_reused_sends_a_zero_row_observation():
    conn = ready(["reuse-feedback-obs"])
    conn.infer([0], [0], [row(text="go")])
    conn.receive(action([0]))
    conn.feedback([0], [0], [row(2, text="go")], [1.0], [False], [False], {})
    message = decoded(conn.infer([0], [1], [SAME_AS_FEEDBACK]))
    assert message["reuse"].tolist() == [True]
    assert message["data"]["images"]["cam"].shape == (0, 2, 3, 3)
    assert message["data"]["states"]["t"].shape == (0, 1)
    assert message["data"]["text"].shape == (0,)


def test_close_reports_every_env_that_loses_its_chunk_and_forgets_reusable_rows():
    conn = ready(["reuse-feedback-obs"])
    conn.infer([0, 1, 2], [0, 0, 0], [row(), row(), row()])
    conn.receive(action([0, 1, 2]))
    conn.feedback([1], [0], [row()], [1.0], [False], [False], {})
    conn.infer([1], [1], [SAME_AS_FEEDBACK])
    assert conn.close() == (0, 1, 2)
    assert not conn.may_reuse(1)
    assert conn.phase is Phase.CLOSED


def test_feedback_message_layout():
    conn = ready()
    conn.infer([4, 2], [0, 3], [row(), row()])
    conn.receive(action([4, 2]))
    message = decoded(
        conn.feedback([2, 4], [3, 0], [row(1, "a"), row(2, "bc")], [2.5, 1.0], [True, False], [False, True], {})
    )
    assert message["message_type"] == "feedback"
    assert message["env_indices"].dtype.str == "<i8" and message["env_indices"].tolist() == [2, 4]
    assert message["step_ids"].tolist() == [3, 0]
    data = message["data"]
    assert data["rewards"].dtype.str == "<f4" and data["rewards"].tolist() == [2.5, 1.0]
    assert data["terminated"].dtype.str == "|b1" and data["terminated"].tolist() == [True, False]
    assert data["truncated"].tolist() == [False, True]
    assert data["obs"]["states"]["t"].dtype.str == "<f8" and data["obs"]["states"]["t"].shape == (2, 1)
    assert data["obs"]["images"]["cam"].dtype.str == "|u1" and data["obs"]["images"]["cam"].shape == (2, 2, 3, 3)
    assert data["obs"]["text"].dtype.str == "<U2" and data["obs"]["text"].tolist() == ["a", "bc"]
    assert data["info"] == {}


def test_text_can_be_sent_as_a_list_of_str():
    conn = Connection(text_format="list")
    conn.receive(metadata())
    message = decoded(conn.infer([0], [0], [row(text="pick")]))
    assert message["data"]["text"] == ["pick"]
