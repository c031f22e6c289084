"""The policy section: parsed into frozen settings, or refused at startup naming the key, the value, what is allowed."""

from __future__ import annotations

import numpy as np
import pytest

from plugrl_ros.params.declarations import SPECS, descriptor, find_spec, parameter_value, spec_for
from plugrl_ros.params.policy import POLICY_SPECS, check_policy_environment, load_policy_config
from plugrl_ros.params.section import ConfigError, nest

SOURCES = {"images.front", "images.wrist", "states.joints", "text"}


def section(**overrides):
    values = {
        "uri": "ws://127.0.0.1:8000",
        "observations": {"observation": {"image": "images.front", "state": "states.joints"}, "prompt": "text"},
    }
    values.update(overrides)
    return values


def test_defaults_and_the_openpi_flat_key_layout():
    config = load_policy_config(section(), SOURCES)
    assert config.server.uri == "ws://127.0.0.1:8000" and config.server.api_key_env == ""
    assert config.action_key == "actions" and (config.action_horizon, config.action_dim) == (0, 0)
    e = config.execution
    assert (e.mode, e.request_ahead_steps, e.ensemble_rate, e.crossfade_steps) == ("switch", None, 0.01, 5)
    assert (e.initial_latency_s, e.max_latency_s, e.first_answer_s) == (0.1, 5.0, 300.0)
    assert config.server.tcp_timeout_s == 20.0  # keepalive and TCP_USER_TIMEOUT on every connection
    image = np.zeros((2, 2, 3), np.uint8)
    request = config.layout.build({"images.front": image, "states.joints": np.ones(3), "text": "pick"})
    assert sorted(request) == ["observation/image", "observation/state", "prompt"]
    assert request["observation/image"] is image and request["prompt"] == "pick"
    assert config.expectation(min_width=7).min_width == 7


def test_nested_maps_for_policies_that_read_them_and_a_flat_ros_parameter_file():
    flat = {
        "policy.uri": "wss://gpu:8000",
        "policy.key_separator": "",
        "policy.observations.images.cam_high": "images.front",
        "policy.observations.images.cam_wrist": "images.wrist",
        "policy.observations.state": "states.joints",
        "policy.execution.mode": "ensemble",
        "policy.execution.request_ahead_steps": 8,
        "policy.execution.ensemble_rate": 0.2,
        "policy.action_horizon": 10,
        "policy.latency.max_s": 1.5,
        "policy.latency.first_answer_s": 60.0,
        "policy.tcp_timeout_s": 8.0,
    }
    config = load_policy_config(nest(flat)["policy"], SOURCES)
    request = config.layout.build({"images.front": 1, "images.wrist": 2, "states.joints": 3})
    assert request == {"images": {"cam_high": 1, "cam_wrist": 2}, "state": 3}
    assert config.execution.mode == "ensemble" and config.execution.request_ahead_steps == 8
    assert config.execution.ensemble_rate == 0.2 and config.execution.max_latency_s == 1.5
    assert config.execution.first_answer_s == 60.0 and config.server.tcp_timeout_s == 8.0
    assert config.expectation(2).horizon == 10


@pytest.mark.parametrize(
    ("overrides", "key", "allowed"),
    [
        ({"uri": "http://gpu:8000"}, "policy.uri", "a ws:// or wss:// URI"),
        ({"urii": "ws://x:1"}, "policy.urii", "did you mean 'uri'?"),
        ({"observations": {}}, "policy.observations", "at least one request key"),
        (
            {"observations": {"observation": {"image": "images.back"}}},
            "policy.observations.observation.image",
            "one of",
        ),
        ({"observations": {"state": 3}}, "policy.observations.state", "expected a string"),
        ({"observations": {"a/b": "text", "a": {"b": "states.joints"}}}, "policy.observations.a.b", "given twice"),
        ({"key_separator": "-"}, "policy.key_separator", 'allowed: /, ., ""'),
        ({"action_key": ""}, "policy.action_key", "the answer's key"),
        ({"action_horizon": -1}, "policy.action_horizon", "at least 0"),
        ({"action_dim": 2.5}, "policy.action_dim", "expected an integer"),
        ({"execution": {"mode": "blend"}}, "policy.execution.mode", "allowed: sync, switch, ensemble, crossfade"),
        ({"execution": {"request_ahead_steps": "auto"}}, "policy.execution.request_ahead_steps", "an integer"),
        ({"execution": {"request_ahead_steps": -1}}, "policy.execution.request_ahead_steps", "at least 0"),
        (
            {"action_horizon": 10, "execution": {"request_ahead_steps": 10}},
            "policy.execution.request_ahead_steps",
            "below policy.action_horizon (10)",
        ),
        # one-step chunks run only in sync: in switch every answer would come after its one step
        ({"action_horizon": 1}, "policy.execution.mode", "got 'switch'; policy.action_horizon is 1"),
        ({"action_horizon": 1, "execution": {"mode": "ensemble"}}, "policy.execution.mode", "use policy.execution"),
        ({"execution": {"crossfade_steps": 0}}, "policy.execution.crossfade_steps", "at least 1"),
        ({"execution": {"ensemble_rate": float("nan")}}, "policy.execution.ensemble_rate", "finite"),
        ({"execution": {"rate": 1}}, "policy.execution.rate", "known keys"),
        ({"observations": {"a": {"b": {"c": {"d": "text"}}}}}, "policy.observations.a.b.c.d", "at most three levels"),
        ({"latency": {"max_s": 0}}, "policy.latency.max_s", "greater than 0"),
        ({"latency": {"first_answer_s": 0}}, "policy.latency.first_answer_s", "greater than 0"),
        ({"tcp_timeout_s": -1}, "policy.tcp_timeout_s", "at least 0"),
        ({"latency": {"initial_s": 2.0, "max_s": 1.0}}, "policy.latency.initial_s", "at most latency.max_s"),
        ({"reconnect_initial_s": 5.0, "reconnect_max_s": 1.0}, "policy.reconnect_max_s", ">= reconnect_initial_s"),
        ({"execution": "switch"}, "policy.execution", "a map of keys"),
    ],
)
def test_a_mistake_is_refused_naming_the_full_key(overrides, key, allowed):
    with pytest.raises(ConfigError) as caught:
        load_policy_config(section(**overrides), SOURCES)
    assert caught.value.key == key
    assert allowed in str(caught.value)


def test_the_uri_is_required_and_every_key_read_is_recorded_for_declaration():
    values = section()
    del values["uri"]
    with pytest.raises(ConfigError, match=r"policy\.uri: got \(missing\); this key is required"):
        load_policy_config(values, SOURCES)
    used: dict = {}
    load_policy_config(section(execution={"mode": "sync"}), SOURCES, used)
    assert used["policy.uri"] == "ws://127.0.0.1:8000" and used["policy.execution.mode"] == "sync"
    assert used["policy.observations.observation.image"] == "images.front"
    assert used["policy.latency.max_s"] == 5.0  # defaults too: the node declares what it runs with
    assert {find_spec(key, POLICY_SPECS) is not None for key in used} == {True}


def test_request_ahead_steps_0_means_from_the_measured_latency():
    assert load_policy_config(section(), SOURCES).execution.request_ahead_steps is None
    config = load_policy_config(section(execution={"request_ahead_steps": 3}), SOURCES)
    assert config.execution.request_ahead_steps == 3


def test_the_api_key_variable_and_the_ca_file_are_checked_against_the_environment(tmp_path):
    config = load_policy_config(section(api_key_env="POLICY_KEY"), SOURCES)
    with pytest.raises(ConfigError, match=r"policy\.api_key_env: got .POLICY_KEY.; the environment variable"):
        check_policy_environment(config, {})
    check_policy_environment(config, {"POLICY_KEY": "secret"})
    bad_ca = tmp_path / "ca.pem"
    bad_ca.write_text("not a certificate")
    config = load_policy_config(section(uri="wss://gpu:8000", ca_file=str(bad_ca)), SOURCES)
    with pytest.raises(ConfigError, match=r"policy\.ca_file"):
        check_policy_environment(config, {})


def test_an_action_dim_narrower_than_the_sinks_read_is_refused():
    config = load_policy_config(section(action_dim=4), SOURCES)
    assert config.expectation(min_width=4).width == 4
    with pytest.raises(ConfigError, match=r"policy\.action_dim: got 4; the actions' sinks read 6"):
        config.expectation(min_width=6)


def test_the_policy_declarations_are_the_policy_part_of_the_bridge_s_table():
    assert POLICY_SPECS and set(POLICY_SPECS) == {spec for spec in SPECS if spec.key.startswith("policy.")}
    assert {spec_for(spec.key) for spec in POLICY_SPECS} == set(POLICY_SPECS)  # no other key's pattern takes one


@pytest.mark.ros
def test_every_policy_key_read_can_be_declared_read_only_on_a_node():
    used: dict = {}
    load_policy_config(section(api_key_env="K", execution={"request_ahead_steps": 4}), SOURCES, used)
    for key, value in used.items():
        spec = find_spec(key, POLICY_SPECS)
        held = parameter_value(spec, value)
        described = descriptor(spec, key, held)
        assert described.read_only and described.name == key
    ranged = descriptor(find_spec("policy.latency.max_s", POLICY_SPECS), "policy.latency.max_s", 5.0)
    assert ranged.floating_point_range[0].from_value == 0.0


# The section inside the bridge's configuration: one params file, `mode` chooses trainer or policy server.

ROBOT = {
    "observations.states.joints.topic": "state",
    "observations.states.joints.type": "std_msgs/Float64MultiArray",
    "observations.text.prompt": "pick",
    "actions.arm.topic": "cmd",
    "actions.arm.type": "std_msgs/Float64MultiArray",
    "actions.arm.slice": [0, 3],
}
POLICY = {
    "policy.uri": "ws://gpu:8000",
    "policy.observations.observation.state": "states.joints",
    "policy.observations.prompt": "text",
}


@pytest.mark.ros
def test_deploy_mode_reads_the_policy_section_beside_the_robot_s_and_records_it_for_declaration():
    from plugrl_ros.ros.config import load_config

    used: dict = {}
    config = load_config({**ROBOT, **POLICY, "mode": "deploy"}, used)
    assert config.mode == "deploy" and config.policy.server.uri == "ws://gpu:8000"
    assert config.policy.layout.build({"states.joints": 1, "text": "pick"}) == {
        "observation/state": 1,
        "prompt": "pick",
    }
    assert used["mode"] == "deploy" and used["policy.execution.mode"] == "switch"
    assert all(spec_for(key) is not None for key in used)  # every key read can be declared on the node
    trained = load_config({**ROBOT, **POLICY})  # train mode: the same file; the section is checked, not run
    assert trained.mode == "train" and trained.policy == config.policy
    assert load_config(ROBOT).policy is None


@pytest.mark.ros
def test_deploy_mode_records_when_record_path_is_set():
    from pathlib import Path

    from plugrl_ros.ros.config import load_config

    deployed = load_config({**ROBOT, **POLICY, "mode": "deploy", "record.path": "/tmp/runs"})
    assert deployed.mode == "deploy" and deployed.record.enabled and deployed.record.path == Path("/tmp/runs")


@pytest.mark.ros
@pytest.mark.parametrize(
    ("extra", "key", "allowed"),
    [
        ({"mode": "deploy"}, "policy.uri", "mode is deploy: give the policy section"),
        ({"mode": "infer", **POLICY}, "mode", "allowed: train, deploy"),
        ({"mode": "deploy", **POLICY, "control.mode": "lockstep"}, "control.mode", "deploy mode runs on the control"),
        (
            {**POLICY, "policy.observations.image": "images.front"},
            "policy.observations.image",
            "one of: states.joints, text",
        ),
        ({**POLICY, "policy.action_dim": 2}, "policy.action_dim", "the actions' sinks read 3 values per step"),
        ({**POLICY, "policy.execution.mod": "sync"}, "policy.execution.mod", "did you mean 'mode'?"),
        ({"policy": 3}, "policy", "expected a map of keys"),
    ],
)
def test_a_deploy_mistake_fails_at_startup_naming_the_full_key(extra, key, allowed):
    from plugrl_ros.ros.config import load_config

    with pytest.raises(ConfigError) as caught:
        load_config({**ROBOT, **extra})
    assert caught.value.key == key
    assert allowed in str(caught.value)


@pytest.mark.ros
def test_startup_checks_the_environment_of_the_mode_s_link_only():
    from plugrl_ros.ros.config import check_environment, load_config

    both = {**ROBOT, **POLICY, "policy.api_key_env": "POLICY_KEY", "trainer.api_key_env": "TRAINER_KEY"}
    with pytest.raises(ConfigError, match=r"policy\.api_key_env: got 'POLICY_KEY'"):
        check_environment(load_config({**both, "mode": "deploy"}), {"TRAINER_KEY": "t"})
    check_environment(load_config({**both, "mode": "deploy"}), {"POLICY_KEY": "p"})
    with pytest.raises(ConfigError, match=r"trainer\.api_key_env: got 'TRAINER_KEY'"):
        check_environment(load_config(both), {"POLICY_KEY": "p"})
    check_environment(load_config(both), {"TRAINER_KEY": "t"})
