"""The declarations are the one source of defaults: the configuration reference (docs/configuration.md, linked from
the README) and config/bridge.yaml agree with them."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from harness import ROOT, rcl_node
from rclpy.parameter import Parameter

from plugrl_ros.params.declarations import NONE, PER_TYPE, REQUIRED, SPECS, spec_for
from plugrl_ros.ros.config import load_config
from plugrl_ros.ros.node_parameters import overrides

pytestmark = [pytest.mark.ros]

REFERENCE = (ROOT / "docs/configuration.md").read_text()
BRIDGE_YAML = ROOT / "config" / "bridge.yaml"

KIND_TYPES = {
    "bool": {Parameter.Type.BOOL},
    "int": {Parameter.Type.INTEGER},
    "float": {Parameter.Type.DOUBLE},
    "str": {Parameter.Type.STRING},
    "int list": {Parameter.Type.INTEGER_ARRAY},
    "str list": {Parameter.Type.STRING_ARRAY},
    "float or float list": {Parameter.Type.DOUBLE, Parameter.Type.DOUBLE_ARRAY},
}


def shown(default) -> str:
    """A default as the reference table writes it."""
    if default is REQUIRED or default is NONE or default is PER_TYPE:
        return repr(default)
    if isinstance(default, bool):
        return "`true`" if default else "`false`"
    if isinstance(default, str):
        return f"`{default}`" if default else '`""`'
    if isinstance(default, list):
        return f"`{json.dumps(default)}`"
    return f"`{default!r}`"


def readme_rows() -> dict[str, tuple[str, str]]:
    section = REFERENCE.split("\n## Keys\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"(?m)^\| `([^`]+)` \| ([^|]+) \| ([^|]+) \|", section)
    keys = [key for key, _, _ in rows]
    assert len(keys) == len(set(keys)), "a key is listed twice"
    return {key: (kind.strip(), default.strip()) for key, kind, default in rows}


def test_the_readme_table_lists_every_declared_key_with_its_type_and_default():
    rows = readme_rows()
    assert set(rows) == {spec.key for spec in SPECS}
    for spec in SPECS:
        assert rows[spec.key] == (spec.kind, shown(spec.default)), spec.key


def _lines_by_key(text: str) -> dict[str, int]:
    """Each dotted key of a params file's /** section -> the 0-based line it is written on."""
    lines: dict[str, int] = {}

    def walk(node: yaml.MappingNode, prefix: str) -> None:
        for key, value in node.value:
            name = f"{prefix}.{key.value}" if prefix else key.value
            if isinstance(value, yaml.MappingNode):
                walk(value, name)
            else:
                lines[name] = key.start_mark.line

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    walk(root.value[0][1].value[0][1], "")
    return lines


def test_bridge_yaml_gives_every_key_with_its_declared_type_and_says_where_it_differs_from_the_default():
    text = BRIDGE_YAML.read_text()
    lines = text.splitlines()
    at = _lines_by_key(text)
    with rcl_node("--params-file", str(BRIDGE_YAML)) as (node, _):
        given = overrides(node)  # as rcl reads the file
    assert set(given) == set(at)
    for key, parameter in given.items():
        spec = spec_for(key)
        assert spec is not None, f"{key} is not a declared key"
        assert parameter.type_ in KIND_TYPES[spec.kind], f"{key}: {parameter.type_} for a {spec.kind}"
        value = list(parameter.value) if isinstance(parameter.value, (list, tuple)) else parameter.value
        if spec.has_default and value != spec.default:
            comment = lines[at[key]].partition("#")[2]
            assert f"(default {shown(spec.default).strip('`')})" in comment, f"{key}: say its default"
    for spec in SPECS:  # every fixed key is given, or shown commented out where it may not be given
        leaf = spec.key.rsplit(".", 1)[-1]
        if "<" not in spec.key and spec.key not in given:
            assert re.search(rf"(?m)^ *# +{leaf}:", text), f"bridge.yaml lacks {spec.key}"
    for spec in SPECS:  # each key of a named section is shown, if only in a comment
        leaf = spec.key.rsplit(".", 1)[-1]
        if leaf == "<path>":  # a map nested like a message type: its own key is shown
            leaf = spec.key.split(".")[-2]
        assert re.search(rf"(?m)^[ #]*{leaf}:|[{{,] {leaf}:", text), f"bridge.yaml never shows {spec.key}"


def test_what_a_config_leaves_out_runs_with_the_declared_default():
    used: dict = {}
    config = load_config(
        {
            "observations.states.pos.topic": "state",
            "observations.states.pos.type": "std_msgs/Float64MultiArray",
            "actions.arm.topic": "cmd",
            "actions.arm.type": "std_msgs/Float64MultiArray",
            "actions.arm.slice": [0, 2],
        },
        used,
    )
    assert config.control.rate_hz == 20.0 and config.actions[0].idle == "hold"
    for key, value in used.items():
        spec = spec_for(key)
        if spec.has_default:
            assert value == spec.default, key
    with_text_topic = {"observations.text.qos", "observations.text.max_age_s", "observations.text.sync"}
    # read when the section is given
    with_section = {s.key for s in SPECS if s.key.startswith(("policy.", "intervention."))}
    assert {s.key for s in SPECS if "<" not in s.key and s.has_default} - with_text_topic - with_section <= set(used)


@pytest.mark.parametrize("spec", [s for s in SPECS if s.has_default], ids=lambda s: s.key)
def test_every_default_is_of_its_declared_type(spec):
    python = {"bool": bool, "int": int, "float": float, "str": str, "str list": list, "float or float list": float}
    assert type(spec.default) is python[spec.kind]
