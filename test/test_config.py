"""Config checks that need no running node: interface type names, the root keys, the environment."""

from __future__ import annotations

import re

import pytest
import trustme

from plugrl_ros.params.section import ConfigError
from plugrl_ros.ros.config import check_environment, load_config

pytestmark = [pytest.mark.ros]

MINIMAL = {
    "observations.states.pos.topic": "state",
    "observations.states.pos.type": "std_msgs/Float64MultiArray",
    "actions.arm.topic": "cmd",
    "actions.arm.type": "std_msgs/Float64MultiArray",
    "actions.arm.slice": [0, 2],
}


def test_interface_types_may_be_written_as_ros2_cli_prints_them():
    config = load_config(
        {
            **MINIMAL,
            "observations.states.pos.type": "std_msgs/msg/Float64MultiArray",
            "reward.topic": "reward",
            "reward.type": "std_msgs/msg/Float64",
            "reset.mode": "service",
            "reset.service_type": "std_srvs/srv/Empty",
        }
    )
    assert config.reward.type_name == "std_msgs/Float64"
    assert config.reset.service_type == "std_srvs/Empty"


@pytest.mark.parametrize(
    ("key", "value"), [("reward.type", "std_msgs/srv/Float64"), ("reset.service_type", "std_srvs/msg/Empty")]
)
def test_a_type_of_the_wrong_kind_is_refused_as_written(key, value):
    with pytest.raises(ConfigError, match=f"{key}: got '{value}'; allowed:"):
        load_config({**MINIMAL, key: value})


def test_a_misspelt_section_is_named_before_the_missing_one():
    flat = {k.replace("observations.", "observation."): v for k, v in MINIMAL.items()}
    with pytest.raises(ConfigError, match=r"observation: got \{states: ...\}; .*did you mean 'observations'\?"):
        load_config(flat)


def test_no_parameters_at_all_says_how_a_params_file_reaches_the_node():
    with pytest.raises(ConfigError, match=r"no bridge parameters arrived: .*'/\*\*' or 'plugrl_bridge'"):
        load_config({"use_sim_time": False})


def test_the_api_key_variable_must_be_set_and_its_name_is_all_that_is_shown():
    config = load_config({**MINIMAL, "trainer.api_key_env": "ROBOT_KEY"})
    named = "trainer.api_key_env: got 'ROBOT_KEY'; the environment variable ROBOT_KEY"
    with pytest.raises(ConfigError, match=re.escape(named)):
        check_environment(config, {})
    with pytest.raises(ConfigError, match="is not set or empty"):
        check_environment(config, {"ROBOT_KEY": ""})
    check_environment(config, {"ROBOT_KEY": "s3cret-value"})


WSS = {**MINIMAL, "trainer.uri": "wss://trainer.lab:8443"}


def test_the_ca_file_must_load_as_a_ca_bundle(tmp_path):
    pem = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(pem))
    check_environment(load_config({**WSS, "trainer.ca_file": str(pem)}), {})
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    for path, reason in ((tmp_path / "missing.pem", "No such file or directory"), (garbage, "")):
        config = load_config({**WSS, "trainer.ca_file": str(path)})
        expected = f"trainer.ca_file: got '{path}'; cannot load it as a CA bundle: {reason}"
        with pytest.raises(ConfigError, match=re.escape(expected)):
            check_environment(config, {})


def test_a_ws_uri_needs_no_ca_file_even_when_the_params_file_names_one(tmp_path):
    """A wss:// config pointed at a ws:// test trainer (``server_uri:=ws://...``) must start."""
    missing = {**MINIMAL, "trainer.uri": "ws://localhost:8000", "trainer.ca_file": str(tmp_path / "lab-ca.pem")}
    check_environment(load_config(missing), {})
    with pytest.raises(ConfigError, match=r"trainer\.ca_file: .*cannot load it as a CA bundle"):
        check_environment(load_config({**missing, "trainer.uri": "wss://localhost:8443"}), {})


def test_an_actuator_without_a_slice_takes_the_whole_action_and_must_be_the_only_one():
    whole = {k: v for k, v in MINIMAL.items() if k != "actions.arm.slice"}
    config = load_config(whole)
    assert config.takes_whole_action and config.action_width_needed == 1
    assert not load_config(MINIMAL).takes_whole_action
    second = {"actions.gripper.topic": "grip", "actions.gripper.type": "std_msgs/Float64"}
    with pytest.raises(
        ConfigError, match=r"actions\.arm\.slice: got \(missing\); a slice: without one .* only actuator"
    ):
        load_config({**whole, **second})
