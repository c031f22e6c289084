"""Tests for plugrl_ros.ros.sources: state and text messages to observation rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from geometry_msgs.msg import PoseStamped, TwistStamped, WrenchStamped
from nav_msgs.msg import Odometry
from sensor_msgs.msg import Imu, JointState, LaserScan
from std_msgs.msg import Float32, Float32MultiArray, Float64, Float64MultiArray, String

from plugrl_ros.params.section import ConfigError, Section
from plugrl_ros.ros.conversion import ShortMessage
from plugrl_ros.ros.sources import (
    STATE_SOURCES,
    ConversionError,
    TextSource,
    check_float_path,
    make_state_source,
)

pytestmark = [pytest.mark.ros]

PREFIX = "observations.states.joints"


def section(**values) -> Section:
    return Section(values, PREFIX)


def source(type_name: str, **values):
    sec = section(**values)
    src = make_state_source(type_name, sec)
    sec.finish()  # the source read every key it was given
    return src


def joint_state(names, position=(), velocity=(), effort=()) -> JointState:
    msg = JointState()
    msg.name = list(names)
    msg.position = [float(v) for v in position]
    msg.velocity = [float(v) for v in velocity]
    msg.effort = [float(v) for v in effort]
    return msg


# --- registry ---------------------------------------------------------------


def test_a_type_without_a_typed_source_needs_field_paths_and_the_error_names_the_choices_and_its_fields():
    with pytest.raises(ConfigError) as e:
        make_state_source("sensor_msgs/Joy", section())
    assert e.value.key == f"{PREFIX}.fields"
    assert "sensor_msgs/JointState" in str(e.value) and "axes (sequence<float>)" in str(e.value)


def test_a_type_that_is_not_installed_is_a_config_error_naming_the_type_key():
    with pytest.raises(ConfigError) as e:
        make_state_source("no_such_msgs/Joy", section())
    assert e.value.key == f"{PREFIX}.type"


def test_type_name_with_msg_infix_is_accepted():
    src = make_state_source("std_msgs/msg/Float64", section())
    assert src.msg_type is Float64


def test_every_registered_class_subscribes_with_a_message_class_of_the_registered_name():
    for name, cls in STATE_SOURCES.items():
        pkg, typ = name.split("/")
        assert cls.msg_type.__name__ == typ
        assert cls.msg_type.__module__.startswith(f"{pkg}.msg")


# --- JointState ---------------------------------------------------------------


def test_joint_state_selects_and_orders_by_name():
    src = source("sensor_msgs/JointState", joints=["elbow", "shoulder"])
    row = src.convert(joint_state(["shoulder", "wrist", "elbow"], position=[1, 2, 3]))
    assert row.dtype == np.float64
    assert row.flags.c_contiguous
    np.testing.assert_array_equal(row, [3.0, 1.0])
    assert src.width == 2


def test_joint_state_follows_a_joint_order_that_changes_between_messages():
    src = source("sensor_msgs/JointState", joints=["a", "b", "c"])
    first = src.convert(joint_state(["a", "b", "c"], position=[1, 2, 3]))
    second = src.convert(joint_state(["c", "a", "b"], position=[3, 1, 2]))
    third = src.convert(joint_state(["a", "b", "c"], position=[4, 5, 6]))
    np.testing.assert_array_equal(first, [1, 2, 3])
    np.testing.assert_array_equal(second, [1, 2, 3])
    np.testing.assert_array_equal(third, [4, 5, 6])


def test_joint_state_output_is_field_major_in_configured_field_order():
    src = source("sensor_msgs/JointState", joints=["b", "a"], fields=["velocity", "position", "effort"])
    msg = joint_state(["a", "b"], position=[1, 2], velocity=[10, 20], effort=[100, 200])
    np.testing.assert_array_equal(src.convert(msg), [20, 10, 2, 1, 200, 100])
    assert src.width == 6


def test_joint_state_missing_joint_names_it_and_the_joints_present():
    src = source("sensor_msgs/JointState", joints=["a", "elbow"])
    with pytest.raises(ConversionError, match=r"joint 'elbow' is not in the JointState \(has: a, b, c\)"):
        src.convert(joint_state(["a", "b", "c"], position=[1, 2, 3]))


def test_joint_state_field_shorter_than_names_is_a_conversion_error_naming_the_field():
    src = source("sensor_msgs/JointState", joints=["a"], fields=["position", "velocity"])
    with pytest.raises(ConversionError, match="velocity"):
        src.convert(joint_state(["a", "b"], position=[1, 2], velocity=[1]))


def test_joint_state_result_does_not_alias_the_message():
    src = source("sensor_msgs/JointState", joints=["a", "b"])
    msg = joint_state(["a", "b"], position=[1, 2])
    row = src.convert(msg)
    msg.position[0] = 99.0
    np.testing.assert_array_equal(row, [1, 2])


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({}, "joints: got (missing)"),
        ({"joints": []}, "must not be empty"),
        ({"joints": ["a", "a"]}, "repeated: a"),
        ({"joints": ["a"], "fields": ["torque"]}, "position, velocity, effort"),
        ({"joints": ["a"], "fields": ["position", "position"]}, "once"),
    ],
)
def test_joint_state_bad_config_is_a_config_error_with_the_full_key(values, fragment):
    with pytest.raises(ConfigError) as e:
        make_state_source("sensor_msgs/JointState", section(**values))
    assert str(e.value).startswith(f"{PREFIX}.")
    assert fragment in str(e.value)


# --- multi arrays and scalars ---------------------------------------------------


@pytest.mark.parametrize(
    ("type_name", "cls"),
    [("std_msgs/Float64MultiArray", Float64MultiArray), ("std_msgs/Float32MultiArray", Float32MultiArray)],
)
def test_multiarray_slice_selects_start_to_stop(type_name, cls):
    src = source(type_name, slice=[1, 3])
    assert src.width == 2
    row = src.convert(cls(data=[0.0, 1.5, 2.5, 3.5]))
    assert row.dtype == np.float64
    np.testing.assert_array_equal(row, [1.5, 2.5])


def test_multiarray_without_slice_is_the_whole_array_with_unknown_width():
    src = source("std_msgs/Float64MultiArray")
    assert src.width is None
    np.testing.assert_array_equal(src.convert(Float64MultiArray(data=[1.0, 2.0, 3.0])), [1, 2, 3])


def test_multiarray_shorter_than_slice_stop_is_a_conversion_error():
    src = source("std_msgs/Float64MultiArray", slice=[0, 4])
    with pytest.raises(ConversionError, match=r"3 values.*at least 4"):
        src.convert(Float64MultiArray(data=[1.0, 2.0, 3.0]))


def test_multiarray_skips_layout_data_offset_padding():
    msg = Float64MultiArray(data=[-1.0, -1.0, 5.0, 6.0])
    msg.layout.data_offset = 2
    np.testing.assert_array_equal(source("std_msgs/Float64MultiArray", slice=[0, 2]).convert(msg), [5, 6])


@pytest.mark.parametrize("bad", [[2, 2], [3, 1], [-1, 2], [0]])
def test_multiarray_bad_slice_is_a_config_error_naming_the_key(bad):
    with pytest.raises(ConfigError) as e:
        make_state_source("std_msgs/Float64MultiArray", section(slice=bad))
    assert e.value.key == f"{PREFIX}.slice"


@pytest.mark.parametrize(("type_name", "cls"), [("std_msgs/Float64", Float64), ("std_msgs/Float32", Float32)])
def test_scalar_is_one_value(type_name, cls):
    src = source(type_name)
    assert src.width == 1
    np.testing.assert_array_equal(src.convert(cls(data=2.5)), [2.5])


# --- geometry field paths --------------------------------------------------------


def test_imu_default_fields_are_orientation_angular_velocity_linear_acceleration():
    msg = Imu()
    msg.orientation.x, msg.orientation.y, msg.orientation.z, msg.orientation.w = 1.0, 2.0, 3.0, 4.0
    msg.angular_velocity.x, msg.angular_velocity.y, msg.angular_velocity.z = 5.0, 6.0, 7.0
    msg.linear_acceleration.x, msg.linear_acceleration.y, msg.linear_acceleration.z = 8.0, 9.0, 10.0
    src = source("sensor_msgs/Imu")
    assert src.width == 10
    np.testing.assert_array_equal(src.convert(msg), np.arange(1, 11))


def test_odometry_default_fields_are_position_orientation_linear_angular():
    msg = Odometry()
    p, q = msg.pose.pose.position, msg.pose.pose.orientation
    lin, ang = msg.twist.twist.linear, msg.twist.twist.angular
    p.x, p.y, p.z = 1.0, 2.0, 3.0
    q.x, q.y, q.z, q.w = 4.0, 5.0, 6.0, 7.0
    lin.x, lin.y, lin.z = 8.0, 9.0, 10.0
    ang.x, ang.y, ang.z = 11.0, 12.0, 13.0
    np.testing.assert_array_equal(source("nav_msgs/Odometry").convert(msg), np.arange(1, 14))


def test_pose_stamped_default_fields_are_position_then_orientation():
    msg = PoseStamped()
    p, q = msg.pose.position, msg.pose.orientation
    p.x, p.y, p.z = 1.0, 2.0, 3.0
    q.x, q.y, q.z, q.w = 4.0, 5.0, 6.0, 7.0
    np.testing.assert_array_equal(source("geometry_msgs/PoseStamped").convert(msg), np.arange(1, 8))


def test_twist_stamped_default_fields_are_linear_then_angular():
    msg = TwistStamped()
    msg.twist.linear.x, msg.twist.linear.y, msg.twist.linear.z = 1.0, 2.0, 3.0
    msg.twist.angular.x, msg.twist.angular.y, msg.twist.angular.z = 4.0, 5.0, 6.0
    np.testing.assert_array_equal(source("geometry_msgs/TwistStamped").convert(msg), np.arange(1, 7))


def test_wrench_stamped_default_fields_are_force_then_torque():
    msg = WrenchStamped()
    msg.wrench.force.x, msg.wrench.force.y, msg.wrench.force.z = 1.0, 2.0, 3.0
    msg.wrench.torque.x, msg.wrench.torque.y, msg.wrench.torque.z = 4.0, 5.0, 6.0
    np.testing.assert_array_equal(source("geometry_msgs/WrenchStamped").convert(msg), np.arange(1, 7))


def test_configured_field_paths_are_read_in_the_configured_order():
    msg = Odometry()
    msg.twist.twist.angular.z = 0.5
    msg.pose.pose.position.x = -2.0
    src = source("nav_msgs/Odometry", fields=["twist.twist.angular.z", "pose.pose.position.x"])
    assert src.width == 2
    np.testing.assert_array_equal(src.convert(msg), [0.5, -2.0])


def test_a_single_field_path_gives_a_row_of_one():
    msg = Imu()
    msg.linear_acceleration.z = 9.81
    row = source("sensor_msgs/Imu", fields=["linear_acceleration.z"]).convert(msg)
    assert row.shape == (1,)
    assert row[0] == 9.81


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("pose.position.q", "has no field 'q'; choose one of: x, y, z"),
        ("pose.posture.x", "has no field 'posture'; choose one of: position, orientation"),
        ("pose.position", "is a message (geometry_msgs/Point); continue it with one of: x, y, z"),
        ("pose.position.x.y", "'pose.position.x' is a number; it has no field 'y'"),
        ("header.frame_id", "not a number"),
        ("", "has no field ''"),
    ],
)
def test_bad_field_path_is_a_config_error_naming_the_key_the_path_and_the_choices(path, fragment):
    with pytest.raises(ConfigError) as e:
        make_state_source("geometry_msgs/PoseStamped", section(fields=["pose.position.x", path]))
    assert e.value.key == f"{PREFIX}.fields"
    assert e.value.value == path
    assert fragment in str(e.value)


def test_covariance_array_is_not_accepted_as_a_number():
    with pytest.raises(ConfigError, match=r"orientation_covariance.*not a number"):
        check_float_path(Imu, "orientation_covariance", "k")


def test_field_path_source_rejects_an_unknown_key_at_finish():
    sec = section(fields=["orientation.w"], field=["orientation.x"])
    make_state_source("sensor_msgs/Imu", sec)
    with pytest.raises(ConfigError, match=rf"{PREFIX}\.field: .*unknown key"):
        sec.finish()


# --- text --------------------------------------------------------------------------


def test_text_source_returns_the_string():
    src = TextSource()
    assert src.msg_type is String
    assert src.convert(String(data="pick up the red block")) == "pick up the red block"


# --- sensor_msgs/LaserScan ----------------------------------------------------


def scan(ranges, intensities=(), range_min=0.1, range_max=10.0) -> LaserScan:
    return LaserScan(
        range_min=range_min,
        range_max=range_max,
        ranges=[float(r) for r in ranges],
        intensities=[float(i) for i in intensities],
    )


# 10 readings: too near (0.05), no return (inf), NaN, and too far (12) are invalid
SCAN = [5.0, 0.05, 3.0, math.inf, math.nan, 2.0, 12.0, 1.5, 4.0, 7.0]


def test_a_scan_is_resampled_to_the_nearest_valid_return_of_each_sector():
    src = source("sensor_msgs/LaserScan", beams=3)
    assert src.width == 3
    # sectors [0, 3), [3, 6), [6, 10); invalid readings count as range_max (10), never as a near obstacle
    np.testing.assert_array_equal(src.convert(scan(SCAN)), [3.0, 2.0, 1.5])


def test_a_scan_taken_every_kth_reading_maps_invalid_readings_to_range_max():
    src = source("sensor_msgs/LaserScan", beams=5, reduce="step")
    np.testing.assert_array_equal(src.convert(scan(SCAN)), [5.0, 3.0, 10.0, 10.0, 4.0])


def test_invalid_readings_take_the_configured_value_and_intensities_follow_the_chosen_readings():
    src = source("sensor_msgs/LaserScan", beams=10, invalid_value=-1.0)
    np.testing.assert_array_equal(src.convert(scan(SCAN)), [5.0, -1.0, 3.0, -1.0, -1.0, 2.0, -1.0, 1.5, 4.0, 7.0])
    src = source("sensor_msgs/LaserScan", beams=2, intensities=True)
    got = src.convert(scan(SCAN, intensities=range(100, 110)))
    # ranges of [0, 5) and [5, 10): 3.0 at reading 2, 1.5 at reading 7; then their intensities
    np.testing.assert_array_equal(got, [3.0, 1.5, 102.0, 107.0])


def test_a_scan_with_fewer_readings_than_beams_or_without_intensities_does_not_convert():
    with pytest.raises(ShortMessage, match="the LaserScan has 10 ranges, fewer than the 11 beams"):
        source("sensor_msgs/LaserScan", beams=11).convert(scan(SCAN))
    with pytest.raises(ConversionError, match="0 intensities for 10 ranges"):
        source("sensor_msgs/LaserScan", beams=2, intensities=True).convert(scan(SCAN))


def test_a_scan_needs_its_beams_and_a_known_reduction():
    with pytest.raises(ConfigError, match=r"observations\.states\.joints\.beams: got \(missing\)"):
        source("sensor_msgs/LaserScan")
    with pytest.raises(ConfigError, match=r"\.reduce: got 'mean'; allowed: min, step"):
        source("sensor_msgs/LaserScan", beams=4, reduce="mean")
