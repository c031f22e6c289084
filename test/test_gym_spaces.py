"""plugrl_ros.gym without ROS: spaces to states and actions, episode seeds, the copies, the generated bridge config."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

gymnasium = pytest.importorskip("gymnasium")
from gymnasium import spaces  # noqa: E402

from plugrl_ros.gym.bridge_config import bridge_config_yaml, bridge_params  # noqa: E402
from plugrl_ros.gym.copies import Camera, GymCopies, GymCopy, episode_seed  # noqa: E402
from plugrl_ros.gym.spaces import UnsupportedSpace, action_layout, observation_keys  # noqa: E402

pytestmark = pytest.mark.gym


def test_a_box_observation_is_one_flat_float64_state_carrying_float64_values_bit_for_bit():
    (key,) = observation_keys(spaces.Box(-np.inf, np.inf, (2, 3), np.float64))
    assert (key.name, key.topic, key.size) == ("observation", "observation", 6)
    tiny = np.array([[5e-324, -0.0, np.pi], [1e308, -1e-300, 1 / 3]])
    values = key.values(tiny)
    assert values.dtype == np.float64 and values.shape == (6,)
    assert values.tobytes() == tiny.reshape(6).tobytes()
    tiny[0, 0] = 7.0
    assert values[0] == 5e-324, "a copy: the env moves on"


def test_float32_observations_widen_to_float64_exactly():
    (key,) = observation_keys(spaces.Box(-1, 1, (3,), np.float32))
    source = np.array([0.1, -0.7, 1e-40], dtype=np.float32)
    assert np.array_equal(key.values(source).astype(np.float32), source)


def test_a_dict_observation_is_one_topic_per_key_and_odd_keys_or_spaces_are_refused():
    keys = observation_keys(spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "mode": spaces.Discrete(4)}))
    assert [(k.name, k.topic, k.size) for k in keys] == [("mode", "observation/mode", 1), ("pos", "observation/pos", 2)]
    assert keys[0].values({"mode": np.int64(3), "pos": np.zeros(2)}).tolist() == [3.0]
    with pytest.raises(UnsupportedSpace, match="'bad key'"):
        observation_keys(spaces.Dict({"bad key": spaces.Box(-1, 1, (1,))}))
    with pytest.raises(UnsupportedSpace, match="Tuple"):
        observation_keys(spaces.Tuple((spaces.Discrete(2),)))
    with pytest.raises(UnsupportedSpace, match=r"observation\['inner'\] is a Dict"):
        observation_keys(spaces.Dict({"inner": spaces.Dict({"x": spaces.Discrete(2)})}))


def test_a_box_action_takes_its_width_casts_to_the_space_dtype_and_refuses_wrong_widths_and_non_finite_values():
    layout = action_layout(spaces.Box(np.float32([-1.0, -2.0]), np.float32([1.0, np.inf]), dtype=np.float32))
    assert (layout.width, layout.low, layout.high) == (2, (-1.0, -2.0), (1.0, np.finfo(np.float64).max))
    action = layout.to_env(np.array([0.1, 5.0]))
    assert action.dtype == np.float32 and action.tolist() == [np.float32(0.1), 5.0]
    assert "expected 2 value(s), got 3" in layout.problem(np.zeros(3))
    assert "NaN or infinite" in layout.problem(np.array([np.nan, 0.0]))
    assert "NaN or infinite" in layout.problem(np.array([0.0, np.inf]))
    assert layout.problem(np.array([0.5, -0.5])) is None
    assert layout.clip(np.array([-7.0, 1e300])).tolist() == [-1.0, 1e300]


def test_an_integer_box_action_is_rounded_and_held_inside_the_space_before_the_cast():
    layout = action_layout(spaces.Box(-2, 3, (3,), np.int8))
    action = layout.to_env(np.array([7.4, -300.0, 1.6]))
    assert action.dtype == np.int8 and action.tolist() == [3, -2, 2]  # not 7, -44 (wrapped), 2


def test_a_discrete_action_is_one_value_rounded_to_the_nearest_allowed_integer():
    layout = action_layout(spaces.Discrete(3, start=-1))
    assert (layout.width, layout.low, layout.high) == (1, (-1.0,), (1.0,))
    assert [int(layout.to_env(np.array([v]))) for v in (-5.0, -1.4, -0.6, 0.49, 0.51, 9.0)] == [-1, -1, -1, 0, 1, 1]
    with pytest.raises(UnsupportedSpace, match="MultiBinary"):
        action_layout(spaces.MultiBinary(3))


def test_an_exact_half_rounds_to_the_even_integer_as_numpy_rint_does():
    """The documented rule (docs/gym.md, spaces.py): nearest integer, halves to even; Discrete and integer Box alike."""
    discrete = action_layout(spaces.Discrete(6, start=-2))
    halves = [-1.5, -0.5, 0.5, 1.5, 2.5]
    assert [int(discrete.to_env(np.array([v]))) for v in halves] == [-2, 0, 0, 2, 2]
    box = action_layout(spaces.Box(-5, 5, (5,), np.int32))
    assert box.to_env(np.array(halves)).tolist() == [-2, 0, 0, 2, 2]


def test_episode_seeds_depend_on_seed_copy_and_episode_and_on_nothing_else():
    seeds = {episode_seed(s, c, e) for s in range(3) for c in range(3) for e in range(3)}
    assert len(seeds) == 27
    assert episode_seed(7, 1, 2) == episode_seed(7, 1, 2)
    assert all(0 <= s < 2**32 for s in seeds)


def test_a_copy_resets_episode_k_with_its_seed_whatever_ran_before():
    first = GymCopy("Pendulum-v1", 1, seed=5)
    first.reset()
    for _ in range(7):
        first.step(np.array([1.5]))
    first.reset()  # episode 1
    second = gymnasium.make("Pendulum-v1")
    expected, _ = second.reset(seed=episode_seed(5, 1, 1))
    assert np.array_equal(first.states()["observation"], expected.astype(np.float64))
    assert first.episodes == 2


def test_in_process_copies_clip_like_the_bridge_and_report_truncation_at_the_env_limit():
    copies = GymCopies("Pendulum-v1", 2, seed=0)
    reference = gymnasium.make("Pendulum-v1")
    reference.reset(seed=episode_seed(0, 1, 0))
    results = [copies.step(1, np.array([9.0])) for _ in range(200)]
    expected = [reference.step(np.array([2.0], dtype=np.float32)) for _ in range(200)]
    assert [r[0] for r in results] == [float(e[1]) for e in expected]
    assert results[-1][1:] == (False, True) and not any(r[2] for r in results[:-1])
    assert np.array_equal(copies.row(1).states["observation"], expected[-1][0].astype(np.float64))
    with pytest.raises(ValueError, match="NaN"):
        copies.step(0, np.array([np.nan]))


def test_the_generated_config_maps_the_env_from_its_own_spaces_and_time_limit():
    params = bridge_params("Reacher-v5", 3)
    assert params["envs"] == ["gym0", "gym1", "gym2"]
    assert params["control"] == {"mode": "lockstep"}
    assert params["observations"] == {
        "states": {"observation": {"topic": "observation", "type": "std_msgs/Float64MultiArray", "qos": "reliable"}}
    }
    action = params["actions"]["action"]
    assert (action["slice"], action["min"], action["max"]) == ([0, 2], [-1.0, -1.0], [1.0, 1.0])
    assert params["episode"]["max_steps"] == 50
    assert params["reward"]["type"] == "std_msgs/Float64"
    assert params["reset"]["mode"] == "service"
    text = bridge_config_yaml("Pendulum-v1", 1, mode="timer", rate_hz=30, camera=Camera(32, 24))
    parsed = yaml.safe_load(text)["/**"]["ros__parameters"]
    assert parsed["control"] == {"mode": "timer", "rate_hz": 30.0}
    assert parsed["observations"]["images"]["camera"]["topic"] == "camera/image_raw"
    assert parsed["episode"]["max_steps"] == 200
    assert "min: [-2.0]" in text, "lists stay on one line, as config/bridge.yaml writes them"


def test_a_discrete_env_gets_its_integer_range_as_the_clip_limits():
    action = bridge_params("CartPole-v1", 1)["actions"]["action"]
    assert (action["min"], action["max"]) == ([0.0], [1.0])


class _DictEnv(gymnasium.Env):
    """A Dict observation (a position and a mode) and a Discrete action: each step adds it to the position."""

    observation_space = spaces.Dict({"pos": spaces.Box(-10, 10, (2,), np.float32), "mode": spaces.Discrete(3)})
    action_space = spaces.Discrete(3, start=-1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return {"pos": self.pos.copy(), "mode": 0}, {}

    def step(self, action):
        self.pos = self.pos + np.float32(action)
        return {"pos": self.pos.copy(), "mode": int(action) + 1}, 1.0, False, False, {}


@pytest.fixture
def dict_env():
    """_DictEnv in Gymnasium's registry for one test, and gone again after it (the registry is global)."""
    gymnasium.register(id="PlugrlDictProbe-v0", entry_point=_DictEnv, max_episode_steps=7)
    yield "PlugrlDictProbe-v0"
    del gymnasium.registry["PlugrlDictProbe-v0"]


@pytest.mark.usefixtures("dict_env")
def test_a_dict_env_gets_one_state_per_key_in_its_config_and_its_rows():
    states = bridge_params("PlugrlDictProbe-v0", 1)["observations"]["states"]
    assert {name: s["topic"] for name, s in states.items()} == {"mode": "observation/mode", "pos": "observation/pos"}
    assert bridge_params("PlugrlDictProbe-v0", 1)["episode"]["max_steps"] == 7
    copies = GymCopies("PlugrlDictProbe-v0", 1, seed=3)
    start = copies.row(0).states["pos"].copy()
    assert copies.step(0, np.array([0.7])) == (1.0, False, False)
    row = copies.row(0).states
    assert row["mode"].tolist() == [2.0]
    assert np.array_equal(row["pos"], (start.astype(np.float32) + 1).astype(np.float64))


@pytest.mark.parametrize(
    ("env_id", "observation_size", "bounds", "max_steps"),
    [
        ("Pendulum-v1", 3, [(-2.0, 2.0)], 200),
        ("InvertedPendulum-v5", 4, [(-3.0, 3.0)], 1000),
        ("Reacher-v5", 10, [(-1.0, 1.0)] * 2, 50),
        ("HalfCheetah-v5", 17, [(-1.0, 1.0)] * 6, 1000),
    ],
)
def test_the_issue_envs_map_their_observation_action_bounds_and_time_limit(env_id, observation_size, bounds, max_steps):
    params = bridge_params(env_id, 1)
    action = params["actions"]["action"]
    assert list(zip(action["min"], action["max"])) == bounds and action["slice"] == [0, len(bounds)]
    assert params["episode"]["max_steps"] == max_steps
    copy = GymCopy(env_id, 0, seed=0)
    copy.reset()
    assert copy.states()["observation"].shape == (observation_size,)
    copy.close()
