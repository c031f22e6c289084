"""Tests for plugrl_ros.ros.sinks: shaped action values to actuator messages, and the shaping itself."""

from __future__ import annotations

import array

import numpy as np
import pytest
from builtin_interfaces.msg import Duration, Time
from geometry_msgs.msg import Twist, TwistStamped
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64, Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from plugrl_ros.params.section import ConfigError, Section
from plugrl_ros.ros.sinks import SINKS, ActionShaper, duration, make_sink
from plugrl_ros.ros.sources import ConversionError

pytestmark = [pytest.mark.ros]

PREFIX = "actions.arm"
STAMP = Time(sec=12, nanosec=345)


def section(**values) -> Section:
    return Section(values, PREFIX)


def sink(type_name: str, period_s: float = 0.02, **values):
    sec = section(**values)
    out = make_sink(type_name, sec, period_s)
    ActionShaper.from_section(sec, out.width)
    sec.finish()  # the sink and the shaper together read every key given
    return out


def shaper(width: int | None, **values) -> ActionShaper:
    sec = section(**values)
    out = ActionShaper.from_section(sec, width)
    sec.finish()
    return out


# --- registry ------------------------------------------------------------------------


def test_a_type_without_a_typed_sink_needs_field_paths_and_the_error_names_the_choices():
    with pytest.raises(ConfigError) as e:
        make_sink("std_msgs/Bool", section(), 0.02)
    assert e.value.key == f"{PREFIX}.fields"
    assert "trajectory_msgs/JointTrajectory" in str(e.value) and "data (boolean)" in str(e.value)


def test_a_sink_type_that_is_not_installed_is_a_config_error_on_the_type_key():
    with pytest.raises(ConfigError) as e:
        make_sink("no_such_msgs/Bool", section(), 0.02)
    assert e.value.key == f"{PREFIX}.type"


def test_every_sink_publishes_the_message_class_of_its_registered_name():
    for name, cls in SINKS.items():
        assert cls.msg_type.__name__ == name.split("/")[1]
        assert cls.msg_type.__module__.startswith(f"{name.split('/')[0]}.msg")


# --- sinks -----------------------------------------------------------------------------


def test_float64_multiarray_width_comes_from_the_required_slice():
    out = sink("std_msgs/Float64MultiArray", slice=[2, 5])
    assert out.width == 3
    msg = out.build(np.array([1.0, 2.0, 3.0]), STAMP)
    assert isinstance(msg, Float64MultiArray)
    assert list(msg.data) == [1.0, 2.0, 3.0]


def test_float64_multiarray_without_a_slice_takes_the_whole_action_as_wide_as_it_comes():
    out = sink("std_msgs/Float64MultiArray")
    assert out.width is None
    s = shaper(None, scale=2.0, offset=1.0, idle="zero")
    assert s.idle_values() is None  # zero of what width? nothing is published before a first step
    for width in (3, 7):
        values = s.shape(np.arange(width, dtype=np.float64))
        np.testing.assert_array_equal(values, 2.0 * np.arange(width) + 1.0)
        assert list(out.build(values, STAMP).data) == values.tolist()
        s.published(values)
        np.testing.assert_array_equal(s.idle_values(), np.zeros(width))
    assert s.shape(np.array([1.0, np.inf])) is None  # a non-finite element still idles it


@pytest.mark.parametrize(
    ("values", "key", "fragment"),
    [
        ({"min": [0.0, 0.0]}, "min", "per-element limits need a slice"),
        ({"max": 1.0}, "max", "per-element limits need a slice"),
        ({"max_delta": 0.1}, "max_delta", "per-element limits need a slice"),
        ({"scale": [1.0, 2.0]}, "scale", r"one number \(applied to every element\)"),
    ],
)
def test_a_whole_action_sink_refuses_per_element_settings_naming_the_key(values, key, fragment):
    with pytest.raises(ConfigError, match=rf"{PREFIX}\.{key}: got .*{fragment}"):
        shaper(None, **values)


def test_joint_state_sink_sets_names_field_and_stamp():
    out = sink("sensor_msgs/JointState", joints=["j1", "j2"], field="velocity")
    assert out.width == 2
    msg = out.build(np.array([0.5, -0.5]), STAMP)
    assert isinstance(msg, JointState)
    assert msg.name == ["j1", "j2"]
    assert list(msg.velocity) == [0.5, -0.5]
    assert len(msg.position) == 0
    assert len(msg.effort) == 0
    assert msg.header.stamp == STAMP


def test_joint_state_sink_defaults_to_position():
    msg = sink("sensor_msgs/JointState", joints=["j1"]).build(np.array([1.25]), STAMP)
    assert list(msg.position) == [1.25]


def test_joint_trajectory_sink_sends_one_point_reached_in_one_period():
    out = sink("trajectory_msgs/JointTrajectory", period_s=1.25, joints=["a", "b", "c"], field="velocities")
    msg = out.build(np.array([1.0, 2.0, 3.0]), STAMP)
    assert isinstance(msg, JointTrajectory)
    assert msg.joint_names == ["a", "b", "c"]
    assert msg.header.stamp == STAMP
    assert len(msg.points) == 1
    point = msg.points[0]
    assert list(point.velocities) == [1.0, 2.0, 3.0]
    assert len(point.positions) == 0
    assert point.time_from_start == Duration(sec=1, nanosec=250_000_000)


def test_joint_trajectory_sink_defaults_to_positions():
    msg = sink("trajectory_msgs/JointTrajectory", joints=["a"]).build(np.array([0.1]), STAMP)
    assert list(msg.points[0].positions) == [0.1]
    assert msg.points[0].time_from_start == Duration(sec=0, nanosec=20_000_000)


def test_duration_rounds_to_the_nanosecond_and_carries_into_seconds():
    assert duration(0.0333333333333) == Duration(sec=0, nanosec=33_333_333)
    assert duration(1.9999999999) == Duration(sec=2, nanosec=0)


def test_twist_sink_sets_the_listed_fields_and_zeroes_the_others():
    out = sink("geometry_msgs/Twist", fields=["angular.z", "linear.x"])
    assert out.width == 2
    msg = out.build(np.array([0.3, 1.5]), STAMP)
    assert isinstance(msg, Twist)
    assert (msg.linear.x, msg.linear.y, msg.linear.z) == (1.5, 0.0, 0.0)
    assert (msg.angular.x, msg.angular.y, msg.angular.z) == (0.0, 0.0, 0.3)


def test_twist_stamped_sink_sets_header_and_fields():
    out = sink("geometry_msgs/TwistStamped", fields=["linear.y"], frame_id="base_link")
    msg = out.build(np.array([-0.2]), STAMP)
    assert isinstance(msg, TwistStamped)
    assert msg.header.frame_id == "base_link"
    assert msg.header.stamp == STAMP
    assert msg.twist.linear.y == -0.2
    assert msg.twist.angular.z == 0.0


def test_float64_sink_has_width_one():
    out = sink("std_msgs/Float64")
    assert out.width == 1
    msg = out.build(np.array([3.5]), STAMP)
    assert isinstance(msg, Float64)
    assert msg.data == 3.5


def test_built_message_does_not_alias_the_values():
    values = np.array([1.0, 2.0])
    msg = sink("sensor_msgs/JointState", joints=["a", "b"]).build(values, STAMP)
    values[0] = 9.0
    assert isinstance(msg.position, array.array)
    assert list(msg.position) == [1.0, 2.0]


@pytest.mark.parametrize(
    ("type_name", "values", "key", "fragment"),
    [
        ("sensor_msgs/JointState", {}, "joints", "required"),
        ("sensor_msgs/JointState", {"joints": ["a", "a"]}, "joints", "repeated: a"),
        ("sensor_msgs/JointState", {"joints": ["a"], "field": "positions"}, "field", "position, velocity, effort"),
        ("trajectory_msgs/JointTrajectory", {"joints": ["a"], "field": "position"}, "field", "positions, velocities"),
        ("geometry_msgs/Twist", {}, "fields", "required"),
        ("geometry_msgs/Twist", {"fields": ["linear.w"]}, "fields", "linear.x"),
        ("geometry_msgs/Twist", {"fields": ["linear.x", "linear.x"]}, "fields", "once"),
        ("geometry_msgs/TwistStamped", {"fields": ["linear.x"], "frame_id": 3}, "frame_id", "string"),
        ("std_msgs/Float64MultiArray", {"slice": [4, 4]}, "slice", "start < stop"),
    ],
)
def test_bad_sink_config_is_a_config_error_with_the_full_key(type_name, values, key, fragment):
    with pytest.raises(ConfigError) as e:
        make_sink(type_name, section(**values), 0.02)
    assert e.value.key == f"{PREFIX}.{key}"
    assert fragment in str(e.value)


# --- ActionShaper: configuration ---------------------------------------------------------


def test_shaper_defaults_read_the_first_width_values_unchanged_and_hold():
    s = shaper(3)
    assert (s.start, s.stop, s.idle) == (0, 3, "hold")
    np.testing.assert_array_equal(s.shape(np.array([1.0, -2.0, 3.0, 4.0])), [1.0, -2.0, 3.0])


@pytest.mark.parametrize(
    ("values", "key", "fragment"),
    [
        ({"slice": [0, 3]}, "slice", "stop - start must be 2"),
        ({"slice": [3, 1]}, "slice", "0 <= start < stop"),
        ({"slice": [-1, 1]}, "slice", "0 <= start < stop"),
        ({"scale": [1.0, 2.0, 3.0]}, "scale", "expected 2 numbers"),
        ({"offset": [1.0]}, "offset", "expected 2 numbers"),
        ({"min": [0.0, 0.0, 0.0]}, "min", "expected 2 numbers"),
        ({"max": "big"}, "max", "numbers"),
        ({"min": [0.0, 1.0], "max": [1.0, 0.5]}, "min", "element 1: min 1.0 > max 0.5"),
        ({"max_delta": [0.1, 0.0]}, "max_delta", "greater than 0"),
        ({"scale": float("nan")}, "scale", "finite"),
        ({"idle": "brake"}, "idle", "hold, zero, none"),
    ],
)
def test_bad_shaper_config_is_a_config_error_with_the_full_key(values, key, fragment):
    with pytest.raises(ConfigError) as e:
        ActionShaper.from_section(section(**values), 2)
    assert e.value.key == f"{PREFIX}.{key}"
    assert fragment in str(e.value)


# --- ActionShaper: shaping -------------------------------------------------------------------


def test_shape_slices_then_scales_then_offsets():
    s = shaper(2, slice=[1, 3], scale=[2.0, -1.0], offset=0.5)
    np.testing.assert_array_equal(s.shape(np.array([9.0, 1.0, 3.0, 9.0])), [2.5, -2.5])


def test_shape_clips_after_scaling():
    # 0.4 * 2 = 0.8 is lifted to min 0.9 and 0.6 * 2 = 1.2 is cut to max 1.0; clipping the
    # raw action before scaling would give [1.8, 2.0] instead.
    s = shaper(2, scale=2.0, min=[0.9, -1.0], max=1.0)
    np.testing.assert_array_equal(s.shape(np.array([0.4, 0.6])), [0.9, 1.0])


def test_max_delta_limits_change_from_the_last_published_values():
    s = shaper(2, max_delta=[0.1, 1.0])
    first = s.shape(np.array([5.0, 5.0]))
    np.testing.assert_array_equal(first, [5.0, 5.0])  # nothing published yet: no limit
    s.published(first)
    np.testing.assert_allclose(s.shape(np.array([6.0, 4.5])), [5.1, 4.5])
    np.testing.assert_allclose(s.shape(np.array([4.0, 2.0])), [4.9, 4.0])


def test_max_delta_applies_after_clipping_and_limits_win_afterwards():
    s = shaper(1, min=0.5, max=2.0, max_delta=0.25, idle="zero")
    s.published(s.idle_values())  # idle published a literal 0, below min
    # Rate limit from 0 would give 0.25; the limits are clipped again and win.
    np.testing.assert_array_equal(s.shape(np.array([3.0])), [0.5])
    s.published(np.array([0.5]))
    # 3.0 clips to 2.0 first, then the rate limit moves only 0.25 towards it.
    np.testing.assert_array_equal(s.shape(np.array([3.0])), [0.75])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_action_gives_none_even_when_it_would_be_clipped(bad):
    s = shaper(2, min=-1.0, max=1.0)
    assert s.shape(np.array([0.0, bad])) is None


def test_overflow_when_scaling_gives_none():
    assert shaper(1, scale=1e300).shape(np.array([1e300])) is None


def test_non_finite_value_outside_the_slice_is_ignored():
    np.testing.assert_array_equal(shaper(1, slice=[0, 1]).shape(np.array([0.5, np.nan])), [0.5])


def test_shape_does_not_modify_its_input():
    action = np.array([1.0, 2.0, 3.0])
    s = shaper(3, scale=2.0, offset=1.0, min=0.0, max=4.0, max_delta=0.5)
    s.published(np.zeros(3))
    out = s.shape(action)
    np.testing.assert_array_equal(action, [1.0, 2.0, 3.0])
    assert not np.shares_memory(out, action)


def test_action_shorter_than_the_slice_is_refused():
    with pytest.raises(ValueError, match=r"reads \[2, 4\)"):
        shaper(2, slice=[2, 4]).shape(np.array([1.0, 2.0, 3.0]))


# --- ActionShaper: idle -------------------------------------------------------------------------


def test_idle_hold_repeats_the_last_published_values_and_nothing_before_that():
    s = shaper(2, idle="hold")
    assert s.idle_values() is None
    s.published(np.array([0.3, 0.4]))
    held = s.idle_values()
    np.testing.assert_array_equal(held, [0.3, 0.4])
    held[0] = 7.0  # the caller's copy, not the shaper's memory
    np.testing.assert_array_equal(s.idle_values(), [0.3, 0.4])


def test_idle_zero_is_literal_zeros_not_the_offset():
    s = shaper(2, idle="zero", offset=[1.0, 2.0], min=0.5)
    np.testing.assert_array_equal(s.idle_values(), [0.0, 0.0])


def test_idle_none_publishes_nothing_even_after_publishing():
    s = shaper(2, idle="none")
    s.published(np.array([1.0, 1.0]))
    assert s.idle_values() is None


def test_published_values_are_copied():
    s = shaper(1)
    values = np.array([0.2])
    s.published(values)
    values[0] = 5.0
    np.testing.assert_array_equal(s.idle_values(), [0.2])


# --- the way back: a person's command in the sink's own message type (interventions) ---------


@pytest.mark.parametrize(
    ("type_name", "keys"),
    [
        ("std_msgs/Float64MultiArray", {"slice": [0, 3]}),
        ("sensor_msgs/JointState", {"joints": ["a", "b", "c"], "field": "velocity"}),
        ("trajectory_msgs/JointTrajectory", {"joints": ["a", "b", "c"]}),
        ("geometry_msgs/Twist", {"fields": ["linear.x", "angular.z", "linear.y"]}),
        ("geometry_msgs/TwistStamped", {"fields": ["linear.x", "angular.z", "linear.y"]}),
        ("std_msgs/Float64", {}),
    ],
)
def test_every_sink_reads_back_the_values_a_message_of_its_own_type_commands(type_name, keys):
    out = sink(type_name, **keys)
    values = np.array([0.5, -1.25, 2.0][: out.width])
    assert np.array_equal(out.read(out.build(values, STAMP)), values)


def test_a_joint_command_is_read_by_joint_name_whatever_the_order_it_comes_in():
    out = sink("sensor_msgs/JointState", joints=["a", "b"])
    msg = JointState(name=["b", "x", "a"], position=[2.0, 9.0, 1.0])
    assert out.read(msg).tolist() == [1.0, 2.0]
    with pytest.raises(ConversionError, match="joint 'a' is not in"):
        out.read(JointState(name=["b"], position=[2.0]))


def test_a_command_of_the_wrong_width_or_without_a_point_is_refused():
    with pytest.raises(ConversionError, match="takes 2"):
        sink("std_msgs/Float64MultiArray", slice=[0, 2]).read(Float64MultiArray(data=[1.0]))
    with pytest.raises(ConversionError, match="no point"):
        sink("trajectory_msgs/JointTrajectory", joints=["a"]).read(JointTrajectory(joint_names=["a"]))


def test_unshape_undoes_scale_and_offset_so_a_command_in_robot_units_becomes_an_action():
    out = shaper(2, scale=[2.0, -0.5], offset=[1.0, 0.0], max=[4.0, 4.0])
    action = np.array([0.75, -3.0])
    values = out.shape(action)
    assert np.allclose(out.unshape(values), action)
    assert out.unshape(out.shape(np.array([10.0, 0.0]))).tolist() == [1.5, 0.0]  # clipped at max, then mapped back
