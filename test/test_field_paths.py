"""Tests for plugrl_ros.ros.field_paths and the generic source and sink: any message type by field path."""

from __future__ import annotations

import numpy as np
import pytest
from builtin_interfaces.msg import Time
from geometry_msgs.msg import PointStamped
from test_msgs.msg import Arrays, BasicTypes, BoundedSequences, Nested, UnboundedSequences

from plugrl_ros.params.section import ConfigError, Section
from plugrl_ros.ros.config import load_config
from plugrl_ros.ros.conversion import ShortMessage
from plugrl_ros.ros.sinks import FieldsSink, make_sink
from plugrl_ros.ros.sources import FieldsSource, make_state_source

pytestmark = [pytest.mark.ros]

STATE = "observations.states.s"
ACTION = "actions.a"


def source(type_name: str, *fields: str) -> FieldsSource:
    section = Section({"fields": list(fields)}, STATE)
    src = make_state_source(type_name, section)
    section.finish()
    assert isinstance(src, FieldsSource)
    return src


def sink(type_name: str, *fields: str, defaults: dict | None = None) -> FieldsSink:
    values: dict = {"fields": list(fields)}
    if defaults is not None:
        values["defaults"] = defaults
    section = Section(values, ACTION)
    out = make_sink(type_name, section, 0.05)
    section.finish()
    assert isinstance(out, FieldsSink)
    return out


def config_error(make, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        make(*args, **kwargs)
    return caught.value


# --- reading ------------------------------------------------------------------------------------


def test_scalars_of_every_numeric_kind_read_in_the_order_of_the_paths():
    src = source("test_msgs/msg/BasicTypes", "uint64_value", "float32_value", "int8_value", "bool_value")
    msg = BasicTypes(uint64_value=7, float32_value=0.5, int8_value=-3, bool_value=True)
    assert src.width == 4
    np.testing.assert_array_equal(src.convert(msg), [7.0, 0.5, -3.0, 1.0])
    assert src.convert(msg).dtype == np.float64


def test_fixed_arrays_read_whole_sliced_by_index_and_through_their_messages():
    src = source(
        "test_msgs/Arrays",
        "float64_values",
        "int32_values[1:3]",
        "uint8_values[0]",
        "basic_types_values[*].int16_value",
    )
    msg = Arrays()
    msg.float64_values = np.array([1.0, 2.0, 3.0])
    msg.int32_values = np.array([4, 5, 6], dtype=np.int32)
    msg.uint8_values = np.array([9, 0, 0], dtype=np.uint8)
    for i, element in enumerate(msg.basic_types_values):
        element.int16_value = -10 * i
    assert src.width == 3 + 2 + 1 + 3
    np.testing.assert_array_equal(src.convert(msg), [1, 2, 3, 5, 6, 9, 0, -10, -20])


def test_a_sequence_is_read_to_its_declared_width_and_a_shorter_one_is_a_short_message_not_a_pad():
    src = source("test_msgs/UnboundedSequences", "float64_values[1:3]", "basic_types_values[0:2].float64_value")
    msg = UnboundedSequences(float64_values=[0.0, 1.5, 2.5, 3.5])
    msg.basic_types_values = [BasicTypes(float64_value=4.0), BasicTypes(float64_value=5.0), BasicTypes()]
    np.testing.assert_array_equal(src.convert(msg), [1.5, 2.5, 4.0, 5.0])
    msg.basic_types_values = [BasicTypes(float64_value=4.0)]
    with pytest.raises(ShortMessage, match=r"'basic_types_values\[0:2\]\.float64_value' reads 2 elements .* has 1"):
        src.convert(msg)
    with pytest.raises(ShortMessage, match=r"float64_values\[1:3\]' reads 3 elements but the message has 2"):
        src.convert(UnboundedSequences(float64_values=[1.0, 2.0]))


def test_nested_messages_are_walked_by_dotted_paths():
    src = source("test_msgs/Nested", "basic_types_value.float64_value", "basic_types_value.int32_value")
    msg = Nested()
    msg.basic_types_value.float64_value = 2.5
    msg.basic_types_value.int32_value = -7
    np.testing.assert_array_equal(src.convert(msg), [2.5, -7.0])


def test_an_installed_type_without_a_typed_source_is_read_generically():
    src = source("geometry_msgs/PointStamped", "point.x", "point.z")
    msg = PointStamped()
    msg.point.x, msg.point.z = 1.0, 3.0
    np.testing.assert_array_equal(src.convert(msg), [1.0, 3.0])


# --- startup errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "type_name, path, said",
    [
        ("test_msgs/BasicTypes", "float_value", "has no field 'float_value'; its fields: bool_value (boolean)"),
        ("test_msgs/Strings", "string_value", "'string_value' in test_msgs/msg/Strings is a string, not a number"),
        ("test_msgs/Nested", "basic_types_value", "is a message (test_msgs/msg/BasicTypes); continue it"),
        ("test_msgs/Nested", "basic_types_value.nope", "'basic_types_value' (test_msgs/msg/BasicTypes) has no field"),
        ("test_msgs/BasicTypes", "int8_value.x", "'int8_value' is a number; it has no field 'x'"),
        ("test_msgs/UnboundedSequences", "float64_values", "of variable length: give the width the path reads"),
        ("test_msgs/UnboundedSequences", "float64_values[*]", "'[*]' has no width"),
        ("test_msgs/BoundedSequences", "float64_values[0:4]", "holds at most 3 values, the path reads to 4"),
        ("test_msgs/Arrays", "float64_values[3]", "holds at most 3 values, the path reads to 4"),
        ("test_msgs/Arrays", "float64_values[2:1]", "selects nothing"),
        ("test_msgs/Arrays", "basic_types_values", "select elements, e.g. 'basic_types_values[*].<field>'"),
        ("test_msgs/Arrays", "basic_types_values[0]", "selects messages (test_msgs/msg/BasicTypes); continue"),
        ("test_msgs/Arrays", "pose..x", "a field path like 'pose.position.x'"),
    ],
)
def test_a_bad_path_is_a_config_error_naming_the_key_the_path_and_what_is_there(type_name, path, said):
    error = config_error(source, type_name, path)
    assert error.key == f"{STATE}.fields" and error.value == path
    assert said in str(error)


@pytest.mark.parametrize(
    "type_name, said",
    [
        ("no_such_msgs/Thing", "no installed ROS package 'no_such_msgs' has msg types"),
        ("test_msgs/msg/Thing", "test_msgs/msg has no type 'Thing'; it has: Arrays, BasicTypes"),
        ("Thing", "an interface type written pkg/Type or pkg/msg/Type"),
    ],
)
def test_a_type_that_is_not_installed_is_a_config_error_on_the_type_key(type_name, said):
    error = config_error(source, type_name, "x")
    assert error.key == f"{STATE}.type" and said in str(error)


# --- writing -------------------------------------------------------------------------------------


def test_the_action_fills_its_paths_and_every_other_field_keeps_its_default():
    out = sink(
        "test_msgs/UnboundedSequences",
        "float64_values[1:3]",
        "basic_types_values[0:2].int32_value",
        defaults={"alignment_check": 7, "float32_values": [1, 2.5], "basic_types_values": {"float64_value": 9}},
    )
    assert out.width == 4
    msg = out.build(np.array([1.5, 2.5, 3.4, -4.6]), Time())
    assert list(msg.float64_values) == [0.0, 1.5, 2.5]  # grown to the path's stop; before start: 0
    assert [(e.int32_value, e.float64_value) for e in msg.basic_types_values] == [(3, 9.0), (-5, 9.0)]
    assert msg.alignment_check == 7 and list(msg.float32_values) == [1.0, 2.5]
    np.testing.assert_array_equal(out.read(msg), [1.5, 2.5, 3.0, -5.0])  # the way back (interventions)
    again = out.build(np.zeros(4), Time())  # one message's values never leak into the next
    assert [e.int32_value for e in again.basic_types_values] == [0, 0]


def test_integers_are_rounded_and_clipped_to_their_type_and_booleans_are_a_half_threshold():
    out = sink("test_msgs/BasicTypes", "int8_value", "uint8_value", "bool_value", "float32_value")
    msg = out.build(np.array([300.0, -2.0, 0.7, 0.25]), Time())
    assert (msg.int8_value, msg.uint8_value, msg.bool_value, msg.float32_value) == (127, 0, True, 0.25)


def test_fixed_arrays_are_written_in_place_and_a_header_gets_the_stamp():
    out = sink("test_msgs/Arrays", "float64_values", "bool_values[1]", defaults={"string_values": ["a", "b", "c"]})
    msg = out.build(np.array([1.0, 2.0, 3.0, 1.0]), Time())
    assert list(msg.float64_values) == [1.0, 2.0, 3.0] and list(msg.bool_values) == [False, True, False]
    assert list(msg.string_values) == ["a", "b", "c"]
    stamped = sink("geometry_msgs/msg/PointStamped", "point.y", defaults={"header": {"frame_id": "base"}})
    msg = stamped.build(np.array([2.0]), Time(sec=5, nanosec=6))
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id, msg.point.y) == (5, 6, "base", 2.0)


@pytest.mark.parametrize(
    "defaults, key, said",
    [
        ({"nope": 1}, "nope", "has no field 'nope'"),
        ({"alignment_check": "x"}, "alignment_check", "the field is a int32"),
        ({"alignment_check": 2**40}, "alignment_check", "the field is a int32"),
        ({"float64_values": 1.0}, "float64_values", "give a list"),
        ({"bool_values": [1]}, "bool_values", "sequence<boolean>"),
        ({"alignment_check": {"a": 1}}, "alignment_check", "not a message"),
        ({"basic_types_values": {"zz": 1}}, "basic_types_values.zz", "test_msgs/msg/BasicTypes has no field 'zz'"),
    ],
)
def test_a_bad_default_is_a_config_error_naming_its_key(defaults, key, said):
    error = config_error(sink, "test_msgs/UnboundedSequences", "float64_values[0:1]", defaults=defaults)
    assert error.key == f"{ACTION}.defaults.{key}" and said in str(error)


def test_bounded_sequences_take_defaults_within_their_bound():
    error = config_error(sink, "test_msgs/BoundedSequences", "float64_values[0:1]", defaults={"int32_values": [1] * 4})
    assert "at most 3 values" in str(error)
    out = sink("test_msgs/BoundedSequences", "float64_values[0:2]", defaults={"int32_values": [1, 2]})
    msg = out.build(np.array([1.0, 2.0]), Time())
    assert list(msg.int32_values) == [1, 2] and list(msg.float64_values) == [1.0, 2.0]
    assert isinstance(msg, BoundedSequences)


def test_defaults_arrive_from_the_flat_parameters_and_every_leaf_is_declared():
    used: dict = {}
    flat = {
        f"{STATE}.topic": "s",
        f"{STATE}.type": "test_msgs/msg/BasicTypes",
        f"{STATE}.fields": ["float64_value"],
        f"{ACTION}.topic": "a",
        f"{ACTION}.type": "test_msgs/msg/Nested",
        f"{ACTION}.fields": ["basic_types_value.float64_value"],
        f"{ACTION}.defaults.basic_types_value.int8_value": 3,
    }
    config = load_config(flat, used)
    msg = config.actions[0].sink.build(np.array([0.5]), Time())
    assert (msg.basic_types_value.float64_value, msg.basic_types_value.int8_value) == (0.5, 3)
    assert used[f"{ACTION}.defaults.basic_types_value.int8_value"] == 3
    from plugrl_ros.params.declarations import descriptor, spec_for

    key = f"{ACTION}.defaults.basic_types_value.int8_value"
    spec = spec_for(key)
    assert spec is not None and descriptor(spec, key, 3).type == 2  # PARAMETER_INTEGER


# --- any reset service -----------------------------------------------------------------------------

RESET_BASE = {
    f"{STATE}.topic": "s",
    f"{STATE}.type": "test_msgs/msg/BasicTypes",
    f"{STATE}.fields": ["float64_value"],
    f"{ACTION}.topic": "a",
    f"{ACTION}.type": "std_msgs/Float64",
    "reset.mode": "service",
}


def reset_config(**reset):
    return load_config({**RESET_BASE, **{f"reset.{k}": v for k, v in reset.items()}}).reset


def test_a_reset_service_of_any_type_takes_its_request_fields_and_reads_success_and_message_by_path():
    reset = reset_config(
        service_type="test_msgs/srv/BasicTypes",
        **{"request.int32_value": 4, "request.string_value": "home"},
        success_field="bool_value",
        message_field="string_value",
    )
    assert reset.service_type == "test_msgs/BasicTypes"
    request = reset.call.make_request()
    assert (request.int32_value, request.string_value, request.bool_value) == (4, "home", False)
    from test_msgs.srv import BasicTypes as BasicTypesSrv

    response = BasicTypesSrv.Response(bool_value=False, string_value="arm not homed")
    assert reset.call.success.read(response)[0] == 0.0 and reset.call.message(response) == "arm not homed"


def test_success_and_message_are_read_where_the_response_has_them_and_nothing_is_required_otherwise():
    trigger = reset_config(service_type="std_srvs/srv/Trigger").call
    assert trigger.success.text == "success" and trigger.message is not None
    empty = reset_config(service_type="std_srvs/Empty").call
    assert empty.success is None and empty.message is None  # any answer is a success


@pytest.mark.parametrize(
    ("reset", "key", "said"),
    [
        ({"service_type": "test_msgs/srv/Nope"}, "reset.service_type", "test_msgs/srv has no type 'Nope'"),
        ({"service_type": "std_srvs/msg/Empty"}, "reset.service_type", "allowed: a srv type"),
        ({"service_type": "test_msgs/BasicTypes", "request.nope": 1}, "reset.request.nope", "has no field 'nope'"),
        ({"service_type": "std_srvs/Empty", "success_field": "ok"}, "reset.success_field", "has no field 'ok'"),
        (
            {"service_type": "test_msgs/BasicTypes", "message_field": "int8_value"},
            "reset.message_field",
            "'int8_value' is a int8, not a string",
        ),
    ],
)
def test_a_bad_reset_service_setting_is_a_config_error_naming_its_key(reset, key, said):
    with pytest.raises(ConfigError) as caught:
        reset_config(**reset)
    assert caught.value.key == key and said in str(caught.value)
