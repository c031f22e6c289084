"""Benchmark of the generic field-path source and sink against the typed converters of the same types.

Run: ``python bench/bench_field_paths.py [--quick] [--json PATH]``. Prints a Markdown table.

For each type that has a typed converter, the same selection is configured twice: once through the
type's own class (the fast path), once through the generic one (``FieldsSource`` / ``FieldsSink``,
what any other type gets). Each case converts one prebuilt message (a source) or builds one message from
prebuilt values (a sink), and both must give the same values, checked before timing. The baseline is the
typed converter in the same run: the ratio is what a robot pays for a type without converter code.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common
from builtin_interfaces.msg import Time
from geometry_msgs.msg import Twist
from nav_msgs.msg import Odometry
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from plugrl_ros.params.section import Section
from plugrl_ros.ros.sinks import FieldsSink, make_sink
from plugrl_ros.ros.sources import FieldsSource, make_state_source

JOINTS = [f"j{i}" for i in range(7)]


def _source_cases() -> list[tuple[str, Any, dict, list[str], Any]]:
    """(label, typed type name, typed keys, generic paths, message)."""
    imu = Imu()
    imu.orientation.w, imu.angular_velocity.z, imu.linear_acceleration.x = 1.0, 0.5, 9.8
    odometry = Odometry()
    odometry.pose.pose.position.x, odometry.twist.twist.angular.z = 1.5, -0.2
    joints = JointState(name=JOINTS, position=[0.1 * i for i in range(7)], velocity=[0.0] * 7, effort=[0.0] * 7)
    array16 = Float64MultiArray(data=[float(i) for i in range(16)])
    imu_paths = [f"orientation.{a}" for a in "xyzw"] + [f"angular_velocity.{a}" for a in "xyz"]
    imu_paths += [f"linear_acceleration.{a}" for a in "xyz"]
    odometry_paths = [f"pose.pose.position.{a}" for a in "xyz"] + [f"pose.pose.orientation.{a}" for a in "xyzw"]
    odometry_paths += [f"twist.twist.linear.{a}" for a in "xyz"] + [f"twist.twist.angular.{a}" for a in "xyz"]
    return [
        ("sensor_msgs/Imu (10 numbers)", "sensor_msgs/Imu", {}, imu_paths, imu),
        ("nav_msgs/Odometry (13 numbers)", "nav_msgs/Odometry", {}, odometry_paths, odometry),
        (
            "sensor_msgs/JointState (7 positions)",
            "sensor_msgs/JointState",
            {"joints": JOINTS},
            ["position[0:7]"],
            joints,
        ),
        (
            "std_msgs/Float64MultiArray (slice of 16)",
            "std_msgs/Float64MultiArray",
            {"slice": [0, 16]},
            ["data[0:16]"],
            array16,
        ),
    ]


def _sink_cases() -> list[tuple[str, str, dict, dict, int]]:
    """(label, type name, typed keys, generic keys, width)."""
    trajectory_defaults = {"joint_names": JOINTS[:6], "points": {"time_from_start": {"nanosec": 20_000_000}}}
    return [
        (
            "geometry_msgs/Twist (2 values)",
            "geometry_msgs/Twist",
            {"fields": ["linear.x", "angular.z"]},
            {"fields": ["linear.x", "angular.z"]},
            2,
        ),
        (
            "std_msgs/Float64MultiArray (6 values)",
            "std_msgs/Float64MultiArray",
            {"slice": [0, 6]},
            {"fields": ["data[0:6]"]},
            6,
        ),
        (
            "trajectory_msgs/JointTrajectory (6 positions)",
            "trajectory_msgs/JointTrajectory",
            {"joints": JOINTS[:6]},
            {"fields": ["points[0:1].positions[0:6]"], "defaults": trajectory_defaults},
            6,
        ),
    ]


def _typed_sink_for(type_name: str, keys: dict) -> Any:
    return make_sink(type_name, Section(keys, "actions.a"), 0.02)


def _generic_sink_for(type_name: str, keys: dict) -> FieldsSink:
    cls = {"geometry_msgs/Twist": Twist, "std_msgs/Float64MultiArray": Float64MultiArray}.get(
        type_name, JointTrajectory
    )
    return FieldsSink(cls, Section(keys, "actions.a"), 0.02)


def run(repeat: int, min_time: float, quick: bool = False) -> list[dict[str, Any]]:
    rows = []
    cases: dict[str, Callable[[], Any]] = {}
    labels = []
    for label, type_name, keys, paths, msg in _source_cases():
        typed = make_state_source(type_name, Section(keys, "observations.states.s"))
        generic = FieldsSource(type(msg), Section({"fields": paths}, "observations.states.s"))
        np.testing.assert_array_equal(typed.convert(msg), generic.convert(msg))  # the same values, or no race
        cases[f"source typed {label}"] = lambda c=typed, m=msg: c.convert(m)
        cases[f"source generic {label}"] = lambda c=generic, m=msg: c.convert(m)
        labels.append(("state source", label))
    # JointState as the bridge takes it: serialized, read in place by the typed source; the generic source
    # reads what rclpy deserializes (the deserialization counted here, as it runs in the subscription).
    joints = next(case[4] for case in _source_cases() if case[1] == "sensor_msgs/JointState")
    raw = serialize_message(joints)
    typed = make_state_source("sensor_msgs/JointState", Section({"joints": JOINTS}, "observations.states.s"))
    generic = FieldsSource(JointState, Section({"fields": ["position[0:7]"]}, "observations.states.s"))
    np.testing.assert_array_equal(typed.convert(raw), generic.convert(deserialize_message(raw, JointState)))
    label = "sensor_msgs/JointState serialized (7 positions, deserialization included)"
    cases[f"source typed {label}"] = lambda c=typed: c.convert(raw)
    cases[f"source generic {label}"] = lambda c=generic: c.convert(deserialize_message(raw, JointState))
    labels.append(("state source", label))
    stamp = Time(sec=1)
    for label, type_name, typed_keys, generic_keys, width in _sink_cases():
        typed = _typed_sink_for(type_name, typed_keys)
        generic = _generic_sink_for(type_name, generic_keys)
        values = np.linspace(-1.0, 1.0, width)
        np.testing.assert_array_equal(
            typed.read(typed.build(values, stamp)), generic.read(generic.build(values, stamp))
        )
        cases[f"sink typed {label}"] = lambda s=typed, v=values: s.build(v, stamp)
        cases[f"sink generic {label}"] = lambda s=generic, v=values: s.build(v, stamp)
        labels.append(("actuator sink", label))
    if quick:  # only checks that the benchmark works: one short timing of each case
        medians = {name: timeit.timeit(case, number=20) / 20 for name, case in cases.items()}
    else:
        medians = common.interleaved_medians(cases, repeat, min_time)
    for kind, label in labels:
        word = "source" if kind == "state source" else "sink"
        typed_s, generic_s = medians[f"{word} typed {label}"], medians[f"{word} generic {label}"]
        rows.append({"kind": kind, "type": label, "typed_s": typed_s, "generic_s": generic_s})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_arguments(parser, repeat=15)
    args = parser.parse_args()
    repeat, min_time = (2, 0.002) if args.quick else (args.repeat, 0.02)
    rows = run(repeat, min_time, args.quick)
    table = [
        (
            r["kind"],
            r["type"],
            common.fmt_us(r["typed_s"]),
            common.fmt_us(r["generic_s"]),
            common.fmt_ratio(r["generic_s"] / r["typed_s"]),
        )
        for r in rows
    ]
    print(common.md_table(["converter", "type", "typed µs", "generic µs", "generic ÷ typed"], table))
    common.save_json(args.json, "field_paths", {"rows": rows})


if __name__ == "__main__":
    main()
