"""docs/design.md's layers: protocol, rollout and policy never import ROS or a higher layer; the robot side
knows no mode; adapters never tools; the bridge never the gym extra."""

from __future__ import annotations

import ast

import pytest
from harness import ROOT

# layer -> modules it must never import (by top-level prefix)
_ABOVE_PURE = ("plugrl_ros.robot", "plugrl_ros.train", "plugrl_ros.node", "plugrl_ros.record")
_ROS_ADAPTERS_AND_ABOVE = ("plugrl_ros.ros", *_ABOVE_PURE, "plugrl_ros.tools", "plugrl_ros.demo", "rclpy")

# layer -> modules it must never import (by top-level prefix)
FORBIDDEN = {
    "protocol": ("plugrl_ros.rollout", "plugrl_ros.policy", *_ROS_ADAPTERS_AND_ABOVE),
    "protocol/policy": ("plugrl_ros.rollout", "plugrl_ros.policy", *_ROS_ADAPTERS_AND_ABOVE),
    "rollout": ("plugrl_ros.policy", *_ROS_ADAPTERS_AND_ABOVE, "websockets"),
    "policy": ("plugrl_ros.rollout", *_ROS_ADAPTERS_AND_ABOVE, "websockets"),
    # the parameters without ROS: declarations, typed sections, the policy section, command-line refusals
    "params": ("plugrl_ros.rollout", *_ROS_ADAPTERS_AND_ABOVE, "websockets"),
    # config and message adapters: below every mode and the robot side (record/ has no ROS: its settings are read here)
    "ros": ("plugrl_ros.robot", "plugrl_ros.train", "plugrl_ros.node", "plugrl_ros.tools", "plugrl_ros.demo"),
    # the robot side knows no mode: the PlugRL rollout, the policy runner and the recorder all drive it
    "robot": (
        "plugrl_ros.rollout",
        "plugrl_ros.policy",
        "plugrl_ros.train",
        "plugrl_ros.node",
        "plugrl_ros.record",
        "plugrl_ros.tools",
        "plugrl_ros.demo",
        "websockets",
    ),
    "train": ("plugrl_ros.policy", "plugrl_ros.node", "plugrl_ros.record", "plugrl_ros.tools", "plugrl_ros.demo"),
    # deploy mode, like train mode, knows the recorder only as an observer (deploy/observer.py)
    "deploy": ("plugrl_ros.rollout", "plugrl_ros.train", "plugrl_ros.record", "plugrl_ros.tools", "plugrl_ros.demo"),
    # teleop mode, like deploy mode, knows the recorder only as an observer, and neither link
    "teleop": (
        "plugrl_ros.rollout",
        "plugrl_ros.train",
        "plugrl_ros.deploy",
        "plugrl_ros.record",
        "plugrl_ros.tools",
        "plugrl_ros.demo",
        "websockets",
    ),
    "node": ("plugrl_ros.tools", "plugrl_ros.demo"),
    # The recorder observes the node, it is not part of it: no rclpy (message definitions are read
    # as files through ament_index), no node code, no rollout state.
    "record": (
        "plugrl_ros.ros",
        "plugrl_ros.robot",
        "plugrl_ros.train",
        "plugrl_ros.node",
        "plugrl_ros.rollout",
        "plugrl_ros.tools",
        "plugrl_ros.demo",
        "rclpy",
        "websockets",
    ),
    # the rllib extra stands on the protocol core, the serving tools and the params reader; never on the bridge
    "rllib": (
        "plugrl_ros.node",
        "plugrl_ros.robot",
        "plugrl_ros.train",
        "plugrl_ros.deploy",
        "plugrl_ros.ros",
        "plugrl_ros.rollout",
        "plugrl_ros.record",
        "rclpy",
    ),
}

# The trainer's side: the one server every trainer face stands on (serve), the Gymnasium vector env (vector)
# and Stable-Baselines3's face (sb3). None stands on the bridge; serve and vector import no trainer library.
_THE_BRIDGE = (
    "plugrl_ros.node",
    "plugrl_ros.robot",
    "plugrl_ros.train",
    "plugrl_ros.deploy",
    "plugrl_ros.teleop",
    "plugrl_ros.ros",
    "plugrl_ros.rollout",
    "plugrl_ros.record",
    "rclpy",
)
FORBIDDEN["serve"] = (
    *_THE_BRIDGE,
    "plugrl_ros.rllib",
    "plugrl_ros.vector",
    "plugrl_ros.sb3",
    "plugrl_ros.gym",
    "ray",
    "torch",
    "stable_baselines3",
)
FORBIDDEN["vector"] = (*_THE_BRIDGE, "plugrl_ros.rllib", "plugrl_ros.sb3", "ray", "torch", "stable_baselines3")
FORBIDDEN["sb3"] = (*_THE_BRIDGE, "plugrl_ros.rllib", "ray")
FORBIDDEN["rllib"] = (*FORBIDDEN["rllib"], "plugrl_ros.vector", "plugrl_ros.sb3", "stable_baselines3")
# the LeRobot writer takes episodes' arrays and the recorded parameters; it reads no recording and knows no trainer
FORBIDDEN["lerobot"] = (*_THE_BRIDGE, "plugrl_ros.rllib", "plugrl_ros.serve", "ray", "torch", "lerobot")
# LeRobot's policies served: a backend of the one policy server, on LeRobot alone (no other trainer's library)
FORBIDDEN["lerobot_policy"] = (*_THE_BRIDGE, "plugrl_ros.rllib", "plugrl_ros.sb3", "ray", "stable_baselines3")

# The optional extras are never imported by the bridge's layers (nor by what they stand on).
EXTRAS = (
    "plugrl_ros.rllib",
    "plugrl_ros.gym",
    "plugrl_ros.serve",
    "plugrl_ros.vector",
    "plugrl_ros.sb3",
    "ray",
    "torch",
    "gymnasium",
    "mujoco",
    "stable_baselines3",
    "plugrl_ros.lerobot",
    "plugrl_ros.lerobot_policy",
    "pyarrow",
    "av",
    "lerobot",
)
BRIDGE_LAYERS = (
    "protocol",
    "protocol/policy",
    "rollout",
    "policy",
    "params",
    "ros",
    "robot",
    "train",
    "deploy",
    "teleop",
    "node",
)


# top-level pure modules whose names only begin like a layer's
NOT_A_LAYER = {"plugrl_ros.ros_args"}


def imports(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", list(FORBIDDEN))
def test_a_lower_layer_never_imports_a_higher_one(layer):
    offenders = []
    paths = sorted((ROOT / "plugrl_ros" / layer).glob("*.py"))
    assert paths, f"no layer {layer}: the table names a package that moved"
    for path in paths:
        for name in imports(path) - NOT_A_LAYER:
            if any(name == bad or name.startswith(bad + ".") or name.startswith(bad + "_") for bad in FORBIDDEN[layer]):
                offenders.append(f"{path.name} imports {name}")
    assert not offenders


# -- the gym extra: an edge the bridge never imports; its direct path has no ROS ----------------------

_GYM_EXTRA = ("plugrl_ros.gym", "gymnasium", "mujoco")
_BRIDGE_LAYERS = (
    "protocol",
    "rollout",
    "policy",
    "params",
    "ros",
    "robot",
    "train",
    "deploy",
    "teleop",
    "node",
    "record",
)
_GYM_WITHOUT_ROS = ("spaces.py", "copies.py", "bridge_config.py", "direct.py")


def _offenders(paths, forbidden) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in paths
        for name in imports(path)
        if any(name == bad or name.startswith(bad + ".") for bad in forbidden)
    ]


def test_no_layer_of_the_bridge_imports_the_gym_extra():
    paths = [path for layer in _BRIDGE_LAYERS for path in sorted((ROOT / "plugrl_ros" / layer).rglob("*.py"))]
    assert len(paths) > 40
    assert not _offenders(paths, _GYM_EXTRA)


def test_the_gym_direct_path_and_config_generation_import_no_ros():
    paths = [ROOT / "plugrl_ros" / "gym" / name for name in _GYM_WITHOUT_ROS]
    assert all(path.exists() for path in paths)
    assert not _offenders(paths, ("rclpy", "plugrl_ros.ros", "plugrl_ros.node", "plugrl_ros.gym.robot_node"))


@pytest.mark.parametrize("layer", BRIDGE_LAYERS)
def test_the_bridge_never_imports_an_optional_extra(layer):
    offenders = []
    for path in sorted((ROOT / "plugrl_ros" / layer).glob("*.py")):
        for name in imports(path):
            if any(name == extra or name.startswith(extra + ".") for extra in EXTRAS):
                offenders.append(f"{path.name} imports {name}")
    assert not offenders
