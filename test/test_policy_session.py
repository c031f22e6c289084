"""The policy-server contract without I/O: metadata first, one request at a time, every answer validated."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.errors import ProtocolError, ProtocolMisuse
from plugrl_ros.protocol.policy.session import Chunk, Expectation, Phase, PolicySession, ServerMetadata, parse_answer


def ready(expect: Expectation | None = None, metadata=None) -> PolicySession:
    session = PolicySession(expect or Expectation())
    assert isinstance(session.receive(codec.packb({} if metadata is None else metadata)), ServerMetadata)
    return session


def answer(actions, **extra) -> bytes:
    return codec.packb({"actions": actions, **extra})


@pytest.mark.parametrize(
    "metadata",
    [
        {},
        {"robot": "aloha", "reset_pose": np.zeros(14)},
        ["not", "a", "map"],
        "text",
        3,
        None,
        {"action_horizon": "ten"},
    ],
)
def test_any_metadata_is_tolerated(metadata):
    session = PolicySession(Expectation())
    result = session.receive(codec.packb(metadata))
    assert isinstance(result, ServerMetadata) and session.phase is Phase.READY
    assert result.horizon is None and result.width is None


def test_announced_shape_is_used_and_checked():
    session = ready(metadata={"action_horizon": 4, "action_dim": 2})
    assert session.metadata.horizon == 4 and session.metadata.width == 2
    session.request({"x": 1})
    with pytest.raises(ProtocolError, match="horizon of 5 steps, expected 4"):
        session.receive(answer(np.zeros((5, 2), "<f4")))
    session.request({"x": 1})
    assert session.receive(answer(np.zeros((4, 2), "<f4"))).horizon == 4


def test_metadata_that_contradicts_the_configured_shape_is_refused():
    session = PolicySession(Expectation(horizon=10))
    with pytest.raises(ProtocolError, match="announces an action horizon of 50, but 10 is configured"):
        session.receive(codec.packb({"action_horizon": 50}))
    assert session.phase is Phase.CLOSED


def test_a_first_frame_that_is_not_msgpack_is_refused():
    with pytest.raises(ProtocolError, match="metadata"):
        PolicySession(Expectation()).receive(b"\xc1")


def test_one_request_at_a_time_and_no_unsolicited_frames():
    session = ready()
    with pytest.raises(ProtocolMisuse):
        PolicySession(Expectation()).request({})  # before the metadata
    frame = session.request({"observation/state": np.arange(3.0), "prompt": "pick"})
    assert codec.unpackb(frame)["prompt"] == "pick"
    with pytest.raises(ProtocolMisuse):
        session.request({})
    chunk = session.receive(answer(np.ones((3, 2), "<f8"), server_timing={"infer_ms": 4.0}, other=[1]))
    assert isinstance(chunk, Chunk) and chunk.server_timing == {"infer_ms": 4.0}
    with pytest.raises(ProtocolError, match="no request was outstanding"):
        session.receive(answer(np.ones((3, 2))))


def test_the_first_answer_fixes_the_shape_and_the_sinks_width_is_a_floor():
    session = ready(Expectation(min_width=3))
    session.request({})
    with pytest.raises(ProtocolError, match="robot's actions read 3"):
        session.receive(answer(np.ones((5, 2), "<f4")))
    session.request({})
    session.receive(answer(np.ones((5, 3), "<f4")))
    session.request({})
    with pytest.raises(ProtocolError, match="expected 5"):
        session.receive(answer(np.ones((6, 3), "<f4")))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ([[1.0, 2.0]], "answer: must be a map"),
        ({"action": np.zeros((2, 2))}, r"actions: is missing from the answer \(its keys: 'action'\)"),
        ({"actions": [[1.0, 2.0]]}, "must be an array"),
        ({"actions": np.zeros((2, 2), "<i4")}, "must hold floats, got dtype <i4"),
        ({"actions": np.zeros((2, 2), "|b1")}, "must hold floats"),
        ({"actions": np.zeros(3, "<f4")}, r"must be \[H, action_dim\], got shape \[3\]"),
        ({"actions": np.zeros((2, 2, 2), "<f4")}, "got shape"),
        ({"actions": np.zeros((0, 2), "<f4")}, "is empty"),
        ({"actions": np.array([[0.0, np.nan]], "<f4")}, "holds nan at step 0, value 1"),
        ({"actions": np.array([[0.0, 0.0], [-np.inf, 0.0]], "<f8")}, "holds -inf at step 1, value 0"),
        ({"actions": np.zeros((2, 3), "<f4")}, "has 3 values per step, expected 2"),
    ],
)
def test_a_malformed_answer_is_a_protocol_error_never_actions(value, match):
    with pytest.raises(ProtocolError, match=match):
        parse_answer(value, "actions", horizon=0, width=2)


def test_the_action_key_is_configurable_and_big_endian_floats_are_read():
    values, timing = parse_answer({"act": np.arange(6, dtype=">f4").reshape(3, 2)}, "act")
    assert values.dtype == np.float64 and values.tolist() == [[0, 1], [2, 3], [4, 5]]
    assert not values.flags.writeable and timing is None


# -- fuzz ------------------------------------------------------------------------

_arrays = hnp.arrays(
    dtype=st.one_of(hnp.floating_dtypes(sizes=(16, 32, 64)), hnp.integer_dtypes(), hnp.boolean_dtypes()),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
)
_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=5), _arrays
)
_answers = st.one_of(
    _leaves,
    st.dictionaries(st.sampled_from(["actions", "server_timing", "x"]), _leaves, max_size=3),
    st.lists(_leaves, max_size=3),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_answers, st.integers(0, 3), st.integers(0, 3))
def test_fuzz_an_answer_gives_finite_float_actions_of_the_expected_shape_or_a_protocol_error(value, horizon, width):
    try:
        actions, _ = parse_answer(codec.unpackb(codec.packb(value)), "actions", horizon, width)
    except ProtocolError:
        return
    source = value["actions"]
    assert source.dtype.kind == "f" and source.ndim == 2
    assert actions.shape == source.shape and actions.dtype == np.float64
    assert actions.shape[0] >= 1 and actions.shape[1] >= 1
    assert (horizon == 0 or actions.shape[0] == horizon) and (width == 0 or actions.shape[1] == width)
    assert np.isfinite(actions).all()
    np.testing.assert_array_equal(actions, source.astype(np.float64))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
def test_fuzz_arbitrary_bytes_as_an_answer_are_a_chunk_or_a_protocol_error(frame):
    session = ready()
    session.request({})
    try:
        result = session.receive(frame)
    except ProtocolError:
        assert session.phase is Phase.READY  # the connection survives a bad answer
        return
    assert isinstance(result, Chunk) and np.isfinite(result.actions).all()


def test_an_answer_built_by_plain_msgpack_like_openpi_is_read():
    raw = np.array([[0.5, -1.0]], "<f4")
    frame = msgpack.packb(
        {"actions": {b"__ndarray__": True, b"data": raw.tobytes(), b"dtype": "<f4", b"shape": (1, 2)}},
        use_bin_type=True,
    )
    session = ready()
    session.request({})
    assert session.receive(frame).actions.tolist() == [[0.5, -1.0]]
