"""The command line's params files and overrides, read before ROS 2 reads them (pure: no ROS here)."""

from __future__ import annotations

import array
import math
import re
from pathlib import Path

import pytest

from plugrl_ros.ros.param_sources import (
    ParamSource,
    check_arrival,
    check_for_node,
    has_empty_list,
    node_pattern_matches,
    read_param_sources,
    ros_scalar,
)
from plugrl_ros.ros.params import ConfigError

FILE = "/**:\n  ros__parameters:\n    control:\n      rate_hz: 20.0\n    envs: [a, b]\n"


def params_file(tmp_path: Path, text: str = FILE, name: str = "bridge.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("pattern", "fqn", "applies"),
    [
        ("/**", "/plugrl_bridge", True),
        ("/**", "/lab/robots/plugrl_bridge", True),
        ("plugrl_bridge", "/plugrl_bridge", True),
        ("/plugrl_bridge", "/plugrl_bridge", True),
        ("plugrl_bridge", "/lab/plugrl_bridge", False),
        ("/lab/plugrl_bridge", "/lab/plugrl_bridge", True),
        ("/**/plugrl_bridge", "/plugrl_bridge", True),
        ("/**/plugrl_bridge", "/a/b/plugrl_bridge", True),
        ("/*/plugrl_bridge", "/lab/plugrl_bridge", True),
        ("/*/plugrl_bridge", "/plugrl_bridge", False),
        ("/lab/*", "/lab/plugrl_bridge", True),
        ("plugrl_*", "/plugrl_bridge", True),
        ("bridge", "/plugrl_bridge", False),
        ("/**/other", "/lab/plugrl_bridge", False),
    ],
)
def test_node_sections_match_as_ros_2_matches_them(pattern, fqn, applies):
    assert node_pattern_matches(pattern, fqn) is applies


def test_files_and_overrides_are_read_in_command_line_order_and_only_inside_ros_args(tmp_path):
    path = params_file(tmp_path)
    argv = ["bridge", "-p", "ignored:=1", "--ros-args", "--params-file", path, "-p", "control.rate_hz:=50"]
    argv += ["--param", "plugrl_bridge:trainer:={uri: 'ws://h:1', use_reuse: false}", "--", "-p", "after:=2"]
    sources = read_param_sources(argv)
    assert sources == [
        ParamSource(path, "/**", {"control.rate_hz": 20.0, "envs": ["a", "b"]}, from_file=True),
        ParamSource("-p control.rate_hz:=50", None, {"control.rate_hz": 50}),
        ParamSource(
            "--param plugrl_bridge:trainer:={uri: 'ws://h:1', use_reuse: false}",
            "plugrl_bridge",
            {"trainer.uri": "ws://h:1", "trainer.use_reuse": False},
        ),
    ]


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ("/**:\n  ros__parameters:\n    a:\n      b: [1, 2.5]\n", "a.b", "write every number with a decimal point"),
        ("/**:\n  ros__parameters:\n    a: [x, 1]\n", "a", "this one mixes int, string"),
        ("/**:\n  ros__parameters:\n    a: [[1.0], [2.0]]\n", "a", "only numbers, strings or true/false"),
        ("/**:\n  ros__parameters:\n    trainer:\n      ca_file:\n", "trainer.ca_file", "the key has no value"),
        ("/**:\n  parameters:\n    a: 1\n", "/**", "did you mean 'ros__parameters' for 'parameters'?"),
        ("/**:\n  ros_parameters:\n    a: {b: 1}\n", "/**", "did you mean 'ros__parameters' for 'ros_parameters'?"),
        ("lab:\n  bridge:\n    a: 1\n", "lab/bridge", "a node section must hold 'ros__parameters:'"),
        ("/**:\n  ros__parameters:\n    a: [x, y, theta]\n", "a", "reads y, n, yes, no, on, off as true/false"),
        ("/**: 3\n", "/**", "a node section must hold 'ros__parameters:'"),
        ("- a\n- b\n", "--params-file", "expected node sections"),
        ("/**:\n  ros__parameters: {a: [1\n", "--params-file", "not valid YAML"),
    ],
)
def test_what_ros_2_would_refuse_without_naming_it_is_named(tmp_path, text, key, says):
    with pytest.raises(ConfigError) as error:
        read_param_sources(["bridge", "--ros-args", "--params-file", params_file(tmp_path, text)])
    assert error.value.key == key
    assert says in str(error.value)


@pytest.mark.parametrize(
    ("rule", "key", "says"),
    [
        ("a:=[1, 2.5]", "a", "write every number with a decimal point"),
        ("a:=", "a", "the key has no value"),
        ("a:={b: [1, 2.5]}", "a.b", "write every number with a decimal point"),
        ("a:=[1", "a", "not valid YAML"),
        ("a=1", "-p", "expected name:=value"),
    ],
)
def test_overrides_are_checked_like_files(rule, key, says):
    with pytest.raises(ConfigError) as error:
        read_param_sources(["bridge", "--ros-args", "-p", rule])
    assert error.value.key == key
    assert says in str(error.value)


def test_a_missing_file_is_named(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="cannot read it: No such file or directory") as error:
        read_param_sources(["bridge", "--ros-args", "--params-file", missing])
    assert error.value.value == missing


def test_an_empty_file_gives_nothing(tmp_path):
    assert read_param_sources(["bridge", "--ros-args", "--params-file", params_file(tmp_path, "")]) == []


FILE_SOURCE = ParamSource("bridge.yaml", "/**", {"control.rate_hz": 20.0, "episode.max_steps": 100}, True)


def test_values_that_arrived_pass_including_an_int_over_a_float():
    override = ParamSource("-p control.rate_hz:=50", None, {"control.rate_hz": 50})
    check_arrival([FILE_SOURCE, override], "/plugrl_bridge", {"control.rate_hz": 50, "episode.max_steps": 100})
    check_arrival([FILE_SOURCE], "/plugrl_bridge", {"control.rate_hz": 20.0, "episode.max_steps": 100})


@pytest.mark.parametrize(
    ("override", "received", "key", "says"),
    [
        ({"control.rate_hz": "abc"}, {"control.rate_hz": 20.0}, "control.rate_hz", "ROS 2 kept 20.0"),
        ({"episode.max_steps": 100.5}, {"episode.max_steps": 100}, "episode.max_steps", "give it as int, as bridge"),
        ({"control.rate_hz": [1.0, 2.0]}, {"control.rate_hz": 20.0}, "control.rate_hz", "give it as float, as bridge"),
    ],
)
def test_a_value_ros_2_dropped_for_its_type_is_named(override, received, key, says):
    sources = [FILE_SOURCE, ParamSource("-p", None, override)]
    with pytest.raises(ConfigError, match=re.escape(says)) as error:
        check_arrival(sources, "/plugrl_bridge", {"control.rate_hz": 20.0, "episode.max_steps": 100, **received})
    assert error.value.key == key


def test_lists_compare_whatever_sequence_rclpy_hands_back():
    sources = [
        ParamSource("bridge.yaml", "/**", {"a.max": 0.05}, from_file=True),
        ParamSource("-p", None, {"a.max": [0.1, 0.2]}),
    ]
    check_arrival(sources, "/plugrl_bridge", {"a.max": array.array("d", [0.1, 0.2])})
    with pytest.raises(ConfigError, match=r"ROS 2 kept 0\.05"):
        check_arrival(sources, "/plugrl_bridge", {"a.max": 0.05})


def test_sections_for_other_nodes_are_not_compared_but_a_file_for_no_node_at_all_is_refused():
    other = ParamSource("other.yaml", "/other_node", {"control.rate_hz": "abc"}, from_file=True)
    check_arrival([FILE_SOURCE, other], "/plugrl_bridge", {"control.rate_hz": 20.0, "episode.max_steps": 100})
    check_for_node([FILE_SOURCE, other], "/plugrl_bridge")
    with pytest.raises(ConfigError, match=r"no section applies to this node \(/plugrl_bridge\)"):
        check_for_node([other], "/plugrl_bridge")
    check_for_node([ParamSource("-p", "other_node", {"x": 1})], "/plugrl_bridge")  # -p alone: nothing to refuse


def test_an_empty_list_is_refused_only_in_a_section_for_this_node(tmp_path):
    text = "camera_driver:\n  ros__parameters:\n    filters: []\n    exposure: null\n" + FILE
    sources = read_param_sources(["bridge", "--ros-args", "--params-file", params_file(tmp_path, text)])
    assert has_empty_list(sources)
    assert sources[0].values == {"filters": [], "exposure": "null"}  # ROS 2 reads null as text
    check_for_node(sources, "/plugrl_bridge")
    with pytest.raises(ConfigError, match="cannot be empty lists"):
        check_for_node(sources, "/camera_driver")
    envs = [ParamSource("-p", None, {"envs": []})]
    with pytest.raises(ConfigError, match=re.escape('one robot without a namespace: [""]')):
        check_for_node(envs, "/plugrl_bridge")


def test_a_namespace_may_nest_its_node_sections(tmp_path):
    text = "lab:\n  plugrl_bridge:\n    ros__parameters:\n      trainer: {uri: 'ws://h:1'}\n"
    [source] = read_param_sources(["bridge", "--ros-args", "--params-file", params_file(tmp_path, text)])
    assert source.node == "lab/plugrl_bridge" and source.values == {"trainer.uri": "ws://h:1"}
    assert source.applies_to("/lab/plugrl_bridge") and not source.applies_to("/plugrl_bridge")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e3", 1000.0),
        ("1e-3", 0.001),
        ("-2", -2),
        ("010", 8),
        ("0x10", 16),
        ("9223372036854775808", 9.223372036854776e18),
        ("y", True),
        ("Off", False),
        ("tRUE", "tRUE"),
        ("null", "null"),
        ("~", "~"),
        ("1_000", "1_000"),
        ("1e400", "1e400"),
        ("-.inf", -math.inf),
        ("2001-12-14", "2001-12-14"),
        ("'5'", "5"),
        ('"true"', "true"),
    ],
)
def test_scalars_are_typed_as_ros_2_types_them(text, value):
    # (each checked against rclpy's own reading of ``-p k:=<text>``)
    [source] = read_param_sources(["bridge", "--ros-args", "-p", f"k:={text}"])
    got = source.values["k"]
    assert type(got) is type(value) and got == value
    assert ros_scalar("") is None
    assert math.isnan(ros_scalar(".nan"))


def test_a_number_written_as_ros_2_reads_it_passes_the_arrival_check():
    sources = [
        ParamSource("bridge.yaml", "/**", {"a.max_delta": 0.05, "b.use": True}, from_file=True),
        *read_param_sources(["bridge", "--ros-args", "-p", "a.max_delta:=1e-3", "-p", "b.use:=n"]),
    ]
    check_arrival(sources, "/plugrl_bridge", {"a.max_delta": 0.001, "b.use": False})
