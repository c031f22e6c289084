"""The parameter layer against rclpy's own parsing: what rcl reads, refuses or drops, named by key.

Every case goes through real rcl (``rclpy.init`` in a context of its own and
a node whose overrides rcl fills): the bridge never reads a params file's
values itself, so these tests check what users' files and ``-p`` overrides
become, including the files launch_ros writes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness import launch_params_file, rcl_node
from rcl_interfaces.msg import ParameterType
from rclpy.parameter import Parameter

from plugrl_ros.params.command_line import explain_refusal, override_rules, params_files
from plugrl_ros.params.section import ConfigError
from plugrl_ros.ros.config import BridgeConfig
from plugrl_ros.ros.node_parameters import configure

pytestmark = [pytest.mark.ros]

# observations and actions only: each test adds the keys it is about
BASE = """\
/**:
  ros__parameters:
    observations:
      states:
        pos: {topic: state, type: std_msgs/Float64MultiArray}
    actions:
      arm: {topic: cmd, type: std_msgs/Float64MultiArray, slice: [0, 2]}
"""


def params_file(tmp_path: Path, text: str = BASE, name: str = "bridge.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def with_keys(**flat: str) -> str:
    """BASE plus dotted keys (``control__rate_hz="1e3"``) written as they are, as launch_ros writes names."""
    return BASE + "".join(f"    {name.replace('__', '.')}: {text}\n" for name, text in flat.items())


def declared(*ros_args: str) -> tuple[BridgeConfig, dict[str, Parameter]]:
    """The configuration, and every parameter the node then has (name -> Parameter)."""
    with rcl_node(*ros_args) as (node, argv):
        config = configure(node, argv)
        names = node.list_parameters([], 0).names
        return config, {p.name: p for p in node.get_parameters(names)}


def refused(*ros_args: str) -> ConfigError:
    """The error the bridge reports for ``ros_args``: from rcl's refusal, or from the node's check."""
    try:
        with rcl_node(*ros_args) as (node, argv):
            with pytest.raises(ConfigError) as error:
                configure(node, argv)
            return error.value
    except RuntimeError as exc:  # rclpy.init: rcl refused the command line
        explained = explain_refusal(str(exc))
        assert explained is not None, str(exc)
        return explained


# -- values as rcl types them --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "text", "value"),
    [
        ("control.rate_hz", "1e3", 1000.0),
        ("control.rate_hz", "25", 25.0),  # an integer where a float is wanted is taken
        ("control.batch_window_s", "1e-3", 0.001),
        ("episode.max_steps", "010", 8),  # octal, as rcl reads it
        ("episode.max_steps", "0x10", 16),
        ("pause.start_paused", "y", True),
        ("pause.start_paused", "Off", False),
        ("trainer.use_reuse", "n", False),
        ("trainer.api_key_env", "null", "null"),  # text to rcl, not a missing value
        ("trainer.api_key_env", "~", "~"),
        ("trainer.api_key_env", "'5'", "5"),
        ("trainer.uri", '"ws://h:1"', "ws://h:1"),
    ],
)
def test_values_are_taken_as_rcl_types_them_from_a_file_and_from_an_override(tmp_path, key, text, value):
    from_file = declared("--params-file", params_file(tmp_path, with_keys(**{key.replace(".", "__"): text})))[1]
    from_override = declared("--params-file", params_file(tmp_path), "-p", f"{key}:={text}")[1]
    for parameters in (from_file, from_override):
        got = parameters[key].value
        assert type(got) is type(value) and got == value


@pytest.mark.parametrize(
    ("key", "text", "says"),
    [
        ("control.rate_hz", "1e400", "control.rate_hz: got '1e400'; expected a finite number"),  # rcl keeps the text
        ("control.rate_hz", "tRUE", "control.rate_hz: got 'tRUE'; expected a finite number"),
        ("control.rate_hz", "-.inf", "control.rate_hz: got -inf; expected a finite number"),
        ("episode.max_steps", "1_000", "episode.max_steps: got '1_000'; expected an integer"),
        ("trainer.uri", "2001-12-14", "trainer.uri: got '2001-12-14'; a ws:// or wss:// URI"),
        ("pause.start_paused", "1", "pause.start_paused: got 1; expected true or false"),
    ],
)
def test_a_spelling_rcl_reads_as_another_type_is_named(tmp_path, key, text, says):
    error = refused("--params-file", params_file(tmp_path, with_keys(**{key.replace(".", "__"): text})))
    assert says in str(error)


def test_every_key_read_is_declared_read_only_with_its_descriptor(tmp_path):
    config, parameters = declared("--params-file", params_file(tmp_path, with_keys(control__rate_hz="50")))
    assert config.control.rate_hz == 50.0
    assert parameters["control.rate_hz"].type_ == Parameter.Type.DOUBLE and parameters["control.rate_hz"].value == 50.0
    assert parameters["actions.arm.idle"].value == "hold"  # a default of a user-named section
    assert parameters["actions.arm.slice"].type_ == Parameter.Type.INTEGER_ARRAY
    assert list(parameters["envs"].value) == [""]
    assert parameters["observations.states.pos.qos"].value == "sensor_data"
    assert "use_sim_time" in parameters  # rclpy's own, left to it
    with rcl_node("--params-file", params_file(tmp_path)) as (node, argv):
        configure(node, argv)
        [rate] = node.describe_parameters(["control.rate_hz"])
        assert rate.read_only and rate.type == ParameterType.PARAMETER_DOUBLE
        assert rate.floating_point_range[0].from_value == 0.0 and rate.floating_point_range[0].to_value == 2000.0
        assert "control rate" in rate.description
        [mode] = node.describe_parameters(["control.mode"])
        assert mode.additional_constraints == "one of: timer, lockstep"
        [steps] = node.describe_parameters(["episode.max_steps"])
        assert steps.integer_range[0].from_value == 0
        [result] = node.set_parameters([Parameter("control.rate_hz", value=50.0)])
        assert not result.successful and "read-only" in result.reason
        assert node.get_parameter("control.rate_hz").value == 20.0


# -- launch files ---------------------------------------------------------------------------------


LAUNCH_PARAMS = {
    "envs": ["robot1", "robot2"],
    "control": {"rate_hz": 30.0},
    "observations": {
        "states": {"joints": {"topic": "joint_states", "type": "sensor_msgs/JointState", "joints": ["j1", "j2"]}}
    },
    "actions": {"arm": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 2], "max": [1.0, 2.0]}},
}


def test_a_launch_files_inline_parameters_with_python_tuple_lists_are_taken(tmp_path):
    path = launch_params_file(tmp_path / "launch_params_x", "/plugrl_bridge", LAUNCH_PARAMS)
    assert "!!python/tuple" in path.read_text()
    config, parameters = declared("--params-file", str(path))
    assert config.envs == ("robot1", "robot2")
    assert config.states[0].parts[0].converter.joints == ("j1", "j2")
    assert (config.actions[0].start, config.actions[0].stop) == (0, 2)
    assert list(parameters["actions.arm.max"].value) == [1.0, 2.0]
    assert config.control.rate_hz == 30.0


def test_a_launch_file_list_rcl_cannot_type_is_named_in_the_file_launch_wrote(tmp_path):
    params = {**LAUNCH_PARAMS, "actions": {"arm": {**LAUNCH_PARAMS["actions"]["arm"], "max": [1, 2.5]}}}
    path = launch_params_file(tmp_path / "launch_params_x", "/plugrl_bridge", params)
    error = refused("--params-file", str(path))
    assert error.key == "actions.arm.max"
    assert "one type per list" in str(error) and str(path) in str(error)


# -- what rcl refuses, named ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        (BASE + "    a:\n      b: [1, 2.5]\n", "a.b", "write every number with a decimal point"),
        (BASE + "    a: [x, 1]\n", "a", "one type per list"),
        (BASE + "    a: [x, y, theta]\n", "a", "(y, n, yes, no, on, off)"),
        (BASE + "    a: !!python/tuple\n    - x\n    - y\n", "a", "one type per list"),
        (BASE + "    a: [[1.0], [2.0]]\n", "a", "only numbers, strings or true/false"),
        (BASE + "    trainer:\n      ca_file:\n", "trainer.ca_file", "the key has no value"),
        ("/**:\n  parameters:\n    a: 1\n", "/**", "did you mean 'ros__parameters' for 'parameters'?"),
        ("/**:\n  ros_parameters:\n    a: {b: 1}\n", "/**", "did you mean 'ros__parameters' for 'ros_parameters'?"),
        ("lab:\n  bridge:\n    a: 1\n", "lab/bridge", "a node section must hold 'ros__parameters:'"),
        ("/**: 3\n", "/**", "a node section must hold 'ros__parameters:'"),
        ("- a\n- b\n", "--params-file", "expected node sections"),
        ("/**:\n  ros__parameters: {a: [1\n", "--params-file", "not valid YAML"),
    ],
)
def test_what_rcl_refuses_in_a_file_is_named_by_key(tmp_path, text, key, says):
    error = refused("--params-file", params_file(tmp_path, text))
    assert error.key == key
    assert says in str(error)


@pytest.mark.parametrize(
    ("rule", "key", "says"),
    [
        ("a:=[1, 2.5]", "a", "write every number with a decimal point"),
        ("a:=", "a", "the key has no value"),
        ("trainer:={uri: 'ws://h:1'}", "trainer", "set each key of a map by its dotted name"),
        ("a:=[1", "a", "not valid YAML"),
        ("a=1", "-p", "expected name:=value"),
    ],
)
def test_what_rcl_refuses_in_an_override_is_named_by_key(tmp_path, rule, key, says):
    error = refused("--params-file", params_file(tmp_path), "-p", rule)
    assert error.key == key
    assert says in str(error)


def test_a_missing_file_is_named(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    error = refused("--params-file", missing)
    assert error.key == "--params-file" and error.value == missing
    assert "cannot read it: No such file or directory" in str(error)


# -- what rcl takes but the bridge refuses --------------------------------------------------------


@pytest.mark.parametrize(
    ("file_keys", "rule", "key", "says"),
    [
        ({"control__rate_hz": "20.0"}, "control.rate_hz:=fast", "control.rate_hz", "ROS 2 kept 20.0 instead"),
        ({"episode__max_steps": "100"}, "episode.max_steps:=100.5", "episode.max_steps", "give it as an integer"),
        ({"actions__arm__max": "0.5"}, "actions.arm.max:=[1.0, 2.0]", "actions.arm.max", "ROS 2 kept 0.5"),
        ({"control__rate_hz": "20"}, "control.rate_hz:=50.5", "control.rate_hz", "ROS 2 kept 20 instead"),
    ],
)
def test_an_override_rcl_dropped_for_the_files_type_is_named(tmp_path, file_keys, rule, key, says):
    error = refused("--params-file", params_file(tmp_path, with_keys(**file_keys)), "-p", rule)
    assert error.key == key
    assert says in str(error) and f"from -p {rule}" in str(error)


def test_an_override_rcl_took_passes_including_an_integer_over_a_float(tmp_path):
    file = params_file(tmp_path, with_keys(control__rate_hz="20.0", actions__arm__max_delta="0.05"))
    config, _ = declared("--params-file", file, "-p", "control.rate_hz:=50", "-p", "actions.arm.max_delta:=1e-3")
    assert config.control.rate_hz == 50.0
    assert config.actions[0].make_shaper().max_delta.tolist() == [0.001, 0.001]


def test_an_override_for_another_node_is_not_compared(tmp_path):
    file = params_file(tmp_path, with_keys(control__rate_hz="20.0"))
    config, _ = declared("--params-file", file, "-p", "camera_driver:control.rate_hz:=fast")
    assert config.control.rate_hz == 20.0


def test_an_empty_list_is_refused_naming_the_key_only_in_this_nodes_sections(tmp_path):
    other = params_file(tmp_path, "camera_driver:\n  ros__parameters:\n    filters: []\n", "camera.yaml")
    config, _ = declared("--params-file", other, "--params-file", params_file(tmp_path))
    assert config.envs == ("",)
    error = refused("--params-file", params_file(tmp_path, with_keys(envs="[]")))
    assert error.key == "envs" and 'one robot without a namespace: [""]' in str(error)
    error = refused("--params-file", params_file(tmp_path, with_keys(actions__arm__max="[]")))
    assert error.key == "actions.arm.max" and "cannot be empty lists" in str(error)


def test_a_file_with_no_section_for_this_node_names_its_sections(tmp_path):
    path = params_file(tmp_path, BASE.replace("/**:", "bridge:"))
    error = refused("--params-file", path)
    assert error.key == "--params-file" and error.value == [path]
    assert "no section applies to this node (/plugrl_bridge); the file has 'bridge'" in str(error)


def test_a_namespace_nesting_its_node_section_and_a_wildcard_reach_the_node(tmp_path):
    nested = "lab:\n  plugrl_bridge:\n" + "\n".join("  " + line for line in BASE.splitlines()[1:]) + "\n"
    config, _ = declared("-r", "__ns:=/lab", "--params-file", params_file(tmp_path, nested))
    assert config.actions[0].name == "arm"
    wildcard = "/**/plugrl_bridge:\n" + BASE.split("\n", 1)[1]
    config, _ = declared("-r", "__ns:=/lab", "--params-file", params_file(tmp_path, wildcard))
    assert config.actions[0].name == "arm"


def test_the_command_lines_overrides_and_files_are_those_inside_ros_args():
    argv = ["bridge", "-p", "ignored:=1", "--ros-args", "--params-file", "a.yaml", "-p", "x:=1", "--param", "n:y:=2"]
    argv += ["--", "-p", "after:=2", "--ros-args", "--params-file", "b.yaml"]
    assert override_rules(argv) == ["x:=1", "n:y:=2"]
    assert params_files(argv) == ["a.yaml", "b.yaml"]


def test_an_infinity_rcl_reads_in_a_list_is_refused_as_not_finite(tmp_path):
    error = refused("--params-file", params_file(tmp_path, with_keys(actions__arm__max="[.inf, 1.0]")))
    assert error.key == "actions.arm.max" and "expected finite numbers" in str(error)


def test_a_section_name_rcl_refuses_names_the_file_and_rcls_reason(tmp_path):
    path = params_file(tmp_path, "/**/plugrl_*:\n" + BASE.split("\n", 1)[1])  # rcl takes no partial wildcard
    error = refused("--params-file", path)
    assert error.key == "--params-file" and error.value == path
    assert "ROS 2 cannot read it: node name must not contain characters other than alphanumerics" in str(error)


def test_an_error_naming_no_file_or_override_is_left_as_rcl_says_it():
    assert explain_refusal("failed to initialize rcl: unknown ROS arguments: --no-such-ros-flag") is None


def installed(executable: str) -> str:
    """An executable as the venv installed it (what a user types)."""
    return str(Path(sys.executable).parent / executable)


def test_bridge_help_says_how_to_pass_parameters_and_where_every_key_is_documented():
    done = subprocess.run(
        [installed("plugrl-bridge"), "--help"], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: plugrl-bridge --ros-args --params-file PARAMS.yaml"), done.stdout
    reference = re.search(r"every key, commented, with its default:\s+(\S+)", done.stdout)
    assert reference and Path(reference.group(1)).name == "bridge.yaml" and Path(reference.group(1)).is_file()
    assert "ros2 param describe /plugrl_bridge" in done.stdout
    assert "configuration error" not in done.stdout + done.stderr


def test_bridge_refuses_an_option_of_its_own_and_points_at_help():
    done = subprocess.run(
        [installed("plugrl-bridge"), "--rate", "50"], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "takes no options of its own but --check-config (got --rate 50)" in done.stderr and "--help" in done.stderr
