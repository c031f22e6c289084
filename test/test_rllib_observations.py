"""plugrl_ros.serve.observations: a PlugRL batch read row by row into the runner's space, or a clear refusal."""

from __future__ import annotations

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
pytest.importorskip("ray.rllib")

from plugrl_ros.protocol.codec import packb, unpackb  # noqa: E402
from plugrl_ros.serve.observations import ObservationReader, SpaceMismatch  # noqa: E402

pytestmark = [pytest.mark.rllib]

SPACE = gym.spaces.Dict(
    {
        "states": gym.spaces.Dict({"joints": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)}),
        "images": gym.spaces.Dict({"camera": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8)}),
    }
)


def batch(n: int, **changes) -> dict:
    obs = {
        "images": {"camera": np.arange(n * 48, dtype=np.uint8).reshape(n, 4, 4, 3), "extra": np.zeros((n, 2, 2, 3))},
        "states": {"joints": np.arange(2.0 * n).reshape(n, 2), "unused": np.zeros((n, 7))},
        "text": np.asarray(["go"] * n),
    }
    for group, arrays in changes.items():
        obs[group] = {**obs[group], **arrays}
    return obs


def test_rows_hold_the_declared_names_cast_to_the_space_and_ignore_the_rest():
    rows = ObservationReader(SPACE).rows(batch(3), 3, "data")
    assert len(rows) == 3
    assert set(rows[0]) == {"states", "images"} and set(rows[0]["states"]) == {"joints"}
    assert rows[2]["states"]["joints"].tolist() == [4.0, 5.0] and rows[2]["states"]["joints"].dtype == np.float32
    assert rows[1]["images"]["camera"].shape == (4, 4, 3)
    assert all(SPACE.contains(row) for row in rows)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"states": {"joints": np.zeros((3, 5))}}, r"data\.states\.joints: has shape \[3, 5\].*declares \[2\]"),
        ({"images": {"camera": np.zeros((3, 4, 4, 3), np.float32)}}, r"data\.images\.camera: is <f4; images are \|u1"),
        ({"states": {"joints": np.full((3, 2), np.nan)}}, r"data\.states\.joints: holds NaN"),
        ({"states": {"joints": np.asarray([["a", "b"]] * 3)}}, r"data\.states\.joints: is <U1; states are numbers"),
    ],
)
def test_a_row_unlike_the_space_is_refused_naming_the_key(changes, message):
    with pytest.raises(SpaceMismatch, match=message):
        ObservationReader(SPACE).rows(batch(3, **changes), 3, "data")


def test_a_missing_name_is_refused_with_what_the_bridge_sends():
    obs = batch(2)
    del obs["states"]["joints"]
    with pytest.raises(SpaceMismatch, match=r"obs\.states\.joints: is missing.*sends states \['unused'\]"):
        ObservationReader(SPACE).rows(obs, 2, "obs")


def test_an_empty_batch_of_reused_rows_reads_as_no_rows_whatever_names_it_lists():
    obs = {"images": {"camera": np.zeros((0, 4, 4, 3), np.uint8)}, "states": {"joints": np.zeros((0, 2))}, "text": []}
    assert ObservationReader(SPACE).rows(obs, 0, "data") == []
    # PlugRL's conformance checker names no array when every row is reused
    assert ObservationReader(SPACE).rows({"images": {}, "states": {}, "text": []}, 0, "data") == []


def test_rows_own_their_arrays_not_views_of_the_received_frame():
    frame = unpackb(packb(batch(2)))  # decoded arrays are read-only views of the frame's bytes
    assert not frame["images"]["camera"].flags.writeable
    rows = ObservationReader(SPACE).rows(frame, 2, "data")
    for row in rows:
        for group, name in (("images", "camera"), ("states", "joints")):
            array = row[group][name]
            assert array.flags.writeable and array.flags.owndata, (group, name)
    assert rows[1]["images"]["camera"].tolist() == frame["images"]["camera"][1].tolist()


def test_a_space_not_shaped_like_a_plugrl_observation_is_refused():
    with pytest.raises(ValueError, match="Dict of 'states' and/or 'images'"):
        ObservationReader(gym.spaces.Box(-1, 1, (3,)))
    with pytest.raises(ValueError, match="must be a Box"):
        ObservationReader(gym.spaces.Dict({"states": gym.spaces.Dict({"x": gym.spaces.Discrete(2)})}))
