"""plugrl_ros.serve.spaces and chunks: the robot's spaces from the bridge's params file; a chunk as one RL step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

import yaml

from plugrl_ros.params.section import ConfigError
from plugrl_ros.serve.chunks import ChunkMapping, chunk_gamma
from plugrl_ros.serve.spaces import robot_spaces

# ros: the params reader shares a module with the bridge's parameter declarations (rclpy, imported there lazily)
pytestmark = [pytest.mark.rllib, pytest.mark.ros]

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "config" / "demo.yaml"


def params(tmp_path: Path, observations: dict, actions: dict) -> Path:
    """A bridge params file with these sections, as a user writes one."""
    path = tmp_path / "robot.yaml"
    document = {"/**": {"ros__parameters": {"observations": observations, "actions": actions}}}
    path.write_text(yaml.safe_dump(document))
    return path


ARM = {"arm": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 2]}}


def test_the_demo_robots_file_gives_its_states_and_the_motor_limits_as_the_action_bounds():
    spaces = robot_spaces(DEMO, images=[], state_dims={"target": 4})
    states = spaces.observation_space["states"]
    assert set(states.spaces) == {"joints", "target"}
    assert states["joints"].shape == (4,)  # two joints, position and velocity
    assert states["joints"].dtype == np.float32 and states["target"].shape == (4,)
    assert "images" not in spaces.observation_space.spaces
    assert spaces.step_action_space.low.tolist() == [-2.0, -2.0] and spaces.step_action_space.high.tolist() == [2, 2]
    assert spaces.action_space.shape == (2,)  # H = 1: one step is one RL step


def test_a_width_the_file_cannot_tell_must_be_given_and_the_error_names_the_key():
    with pytest.raises(ConfigError, match=r"observations\.states\.target.*state_dims=\{'target': N\}"):
        robot_spaces(DEMO, images=[])
    with pytest.raises(ConfigError, match=r"observations\.images\.camera.*image_shapes"):
        robot_spaces(DEMO, states=["joints"])


def test_images_are_uint8_boxes_of_their_resized_size_and_channels(tmp_path):
    path = params(
        tmp_path,
        {
            "images": {
                "wrist": {"topic": "w", "type": "sensor_msgs/Image", "resize": [48, 64]},
                "depth": {"topic": "d", "type": "sensor_msgs/Image", "crop": [0, 0, 30, 40], "channels": 1},
            }
        },
        ARM,
    )
    images = robot_spaces(path).observation_space["images"]
    assert images["wrist"].shape == (48, 64, 3) and images["wrist"].dtype == np.uint8
    assert images["depth"].shape == (30, 40, 1)
    assert images["wrist"].low.min() == 0 and images["wrist"].high.max() == 255


def test_state_widths_follow_joints_fields_slices_and_parts(tmp_path):
    path = params(
        tmp_path,
        {
            "states": {
                "arm": {
                    "topic": "js",
                    "type": "sensor_msgs/JointState",
                    "joints": ["a", "b", "c"],
                    "fields": ["position", "velocity"],
                },
                "gripper": {"topic": "g", "type": "std_msgs/Float64"},
                "ft": {"topic": "ft", "type": "std_msgs/Float64MultiArray", "slice": [2, 5]},
                "base": {
                    "parts": ["pose", "yaw"],
                    "pose": {"topic": "p", "type": "geometry_msgs/PoseStamped", "fields": ["pose.position.x"]},
                    "yaw": {"topic": "y", "type": "std_msgs/Float32"},
                },
            }
        },
        ARM,
    )
    states = robot_spaces(path).observation_space["states"]
    assert {name: box.shape for name, box in states.spaces.items()} == {
        "arm": (6,),
        "gripper": (1,),
        "ft": (3,),
        "base": (2,),
    }


def test_action_bounds_are_the_sinks_limits_in_the_trainers_units(tmp_path):
    """A sink publishes value * scale + offset clipped to [min, max]: the bound is (limit - offset) / scale."""
    actions = {
        "arm": {
            "topic": "cmd",
            "type": "std_msgs/Float64MultiArray",
            "slice": [0, 2],
            "scale": [2.0, -0.5],
            "offset": 1.0,
            "min": [-1.0, -1.0],
            "max": [3.0, 2.0],
        },
        "base": {"topic": "cmd_vel", "type": "geometry_msgs/Twist", "fields": ["linear.x"], "slice": [3, 4]},
    }
    path = params(tmp_path, {"states": {"s": {"topic": "s", "type": "std_msgs/Float64"}}}, actions)
    step = robot_spaces(path).step_action_space
    # element 0: (-1 - 1) / 2 = -1 .. (3 - 1) / 2 = 1; element 1, a negative scale swaps the ends:
    # (2 - 1) / -0.5 = -2 .. (-1 - 1) / -0.5 = 4; element 2 is read by no sink; element 3 has no limits
    assert step.low.tolist() == [-1.0, -2.0, -np.inf, -np.inf]
    assert step.high.tolist() == [1.0, 4.0, np.inf, np.inf]


def test_a_whole_action_actuator_is_as_wide_as_action_dim_says_and_unbounded(tmp_path):
    """A Float64MultiArray actuator without slice takes the whole action, as wide as the trainer sends it
    (config/probe.yaml's): the trainer gives the width; the bridge allows it one-number scale and offset only."""
    whole = {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "scale": 2.0, "offset": 1.0}}
    path = params(tmp_path, {"states": {"t": {"topic": "t", "type": "std_msgs/Float64"}}}, whole)
    spaces = robot_spaces(path, action_dim=3, horizon=2)
    assert spaces.step_action_space.shape == (3,) and spaces.action_space.shape == (6,)
    assert np.isinf(spaces.step_action_space.low).all() and np.isinf(spaces.step_action_space.high).all()
    with pytest.raises(ConfigError, match=r"actions\.cmd.*whole action.*action_dim=N"):
        robot_spaces(path)
    probe = robot_spaces(ROOT / "config" / "probe.yaml", action_dim=4, state_dims={"a": 4})  # the probe's a is
    assert probe.step_action_space.shape == (4,)  # the action it applied


def test_an_action_dim_the_files_actuators_contradict_is_refused(tmp_path):
    path = params(tmp_path, {"states": {"t": {"topic": "t", "type": "std_msgs/Float64"}}}, ARM)
    assert robot_spaces(path, action_dim=2).step_action_space.shape == (2,)
    with pytest.raises(ValueError, match=r"action_dim=3, but the file's actuators read 2 values"):
        robot_spaces(path, action_dim=3)
    with pytest.raises(ValueError, match="action_dim must be an integer of at least 1"):
        robot_spaces(path, action_dim=0)


def test_a_name_the_file_does_not_configure_is_refused_with_the_ones_it_does(tmp_path):
    with pytest.raises(ConfigError, match=r"observations\.states\.elbow.*it has: joints, target"):
        robot_spaces(DEMO, states=["elbow"], images=[])


def test_the_shipped_example_config_gives_spaces_without_overrides():
    spaces = robot_spaces(ROOT / "config" / "bridge.yaml")
    assert "wrist" in spaces.observation_space["images"].spaces
    assert spaces.step_action_space.shape[0] >= 1


# -- chunks --------------------------------------------------------------------------


def test_the_chunk_space_repeats_the_step_bounds_for_each_of_the_h_steps():
    spaces = robot_spaces(DEMO, horizon=3, images=[], state_dims={"target": 4})
    assert spaces.action_space.shape == (6,)
    assert spaces.action_space.low.tolist() == [-2.0] * 6


def test_to_chunk_is_time_major_step_by_step_per_env():
    mapping = ChunkMapping(horizon=3, action_dim=2)
    # env e, step k, dim d holds 100 e + 10 k + d, flattened time-major per env as the policy emits it
    actions = np.array([[100 * e + 10 * k + d for k in range(3) for d in range(2)] for e in range(2)], dtype=float)
    chunk = mapping.to_chunk(actions)
    assert chunk.shape == (3, 2, 2) and chunk.dtype.str == "<f4"
    for e in range(2):
        for k in range(3):
            assert chunk[k, e].tolist() == [100 * e + 10 * k, 100 * e + 10 * k + 1]


def test_an_action_space_that_is_not_a_whole_chunk_is_refused():
    import gymnasium as gym

    with pytest.raises(ValueError, match="not a whole chunk of horizon 4"):
        ChunkMapping.of(gym.spaces.Box(-1, 1, (6,)), 4)
    with pytest.raises(ValueError, match="flat Box"):
        ChunkMapping.of(gym.spaces.Discrete(3), 1)
    assert ChunkMapping.of(gym.spaces.Box(-1, 1, (6,)), 3) == ChunkMapping(3, 2)


def test_the_discount_per_chunk_is_the_step_discount_to_the_power_h():
    assert chunk_gamma(0.99, 1) == 0.99
    assert chunk_gamma(0.99, 5) == pytest.approx(0.99**5)
    with pytest.raises(ValueError):
        chunk_gamma(1.5, 2)


def test_a_laser_scan_is_as_wide_as_its_beams_and_a_field_path_type_as_state_dims_says(tmp_path):
    path = params(
        tmp_path,
        {
            "states": {
                "scan": {"topic": "scan", "type": "sensor_msgs/LaserScan", "beams": 60},
                "lit": {"topic": "s2", "type": "sensor_msgs/msg/LaserScan", "beams": 8, "intensities": True},
                "battery": {"topic": "b", "type": "sensor_msgs/msg/BatteryState", "fields": ["voltage"]},
            }
        },
        ARM,
    )
    states = robot_spaces(path, state_dims={"battery": 1}).observation_space["states"]
    assert (states["scan"].shape, states["lit"].shape, states["battery"].shape) == ((60,), (16,), (1,))
    # a type read by field paths: its width is the type's, which the trainer side does not import
    with pytest.raises(ConfigError, match=r"observations\.states\.battery.*state_dims=\{'battery': N\}"):
        robot_spaces(path)


def test_an_action_server_or_field_path_actuator_takes_its_width_from_its_slice(tmp_path):
    grip = {"topic": "g", "type": "control_msgs/action/GripperCommand", "fields": ["command.position"]}
    state = {"states": {"s": {"topic": "s", "type": "std_msgs/Float64"}}}
    path = params(tmp_path, state, {"grip": {**grip, "slice": [0, 1], "min": 0.0, "max": 0.08}})
    step = robot_spaces(path).step_action_space
    assert step.shape == (1,) and step.low.tolist() == [0.0] and step.high.tolist() == [pytest.approx(0.08)]
    with pytest.raises(ConfigError, match=r"actions\.grip\.slice: .*give the actuator's slice"):
        robot_spaces(params(tmp_path, state, {"grip": grip}))
