"""Launch the demo the ROS way: the demo trainer, the simulated reachers and the bridge with config/demo.yaml.

    ros2 launch plugrl_ros demo.launch.py [envs:=2] [mode:=lockstep|timer] [rate:=20.0] [duration:=180]

The trainer ends the run after ``duration`` seconds, the bridge then exits by
itself, the trainer writes returns.png and summary.json into ``output`` and
exits. The launch ends when any of the three exits (Ctrl-C too: the results
so far are written). All behaviour lives in the executables.
"""

import os

from launch.actions import DeclareLaunchArgument, EmitEvent, ExecuteProcess, OpaqueFunction, RegisterEventHandler
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import ExecutableInPackage, FindPackageShare

from launch import LaunchDescription


class LaunchArgumentError(Exception):
    """A launch argument that cannot work; launch prints the message and ends."""


def _number(context, name, kind, minimum, maximum=None):
    """The launch argument ``name`` as ``kind`` (int or float) within [minimum, maximum], or a clear error."""
    text = LaunchConfiguration(name).perform(context)
    what = "a whole number" if kind is int else "a number"
    bounds = f" from {minimum:g} to {maximum:g}" if maximum is not None else f" of at least {minimum:g}"
    try:
        value = kind(text)
    except ValueError:
        raise LaunchArgumentError(f"{name}:={text}: expected {what}{bounds}") from None
    if not (value >= minimum and (maximum is None or value <= maximum)):  # NaN fails both
        raise LaunchArgumentError(f"{name}:={text}: expected {what}{bounds}")
    return value


def _demo(context):
    def arg(name):
        return LaunchConfiguration(name).perform(context)

    envs = _number(context, "envs", int, 1, 64)
    mode = arg("mode")
    rate = _number(context, "rate", float, 0.1, 1000.0)
    duration = _number(context, "duration", float, 1.0)
    port = str(_number(context, "port", int, 1, 65535))
    seed = str(_number(context, "seed", int, 0))
    config = arg("config")
    if not os.path.isfile(config):
        raise LaunchArgumentError(f"config:={config}: no such params file")
    trainer = ExecuteProcess(
        cmd=[
            ExecutableInPackage("demo_trainer", "plugrl_ros"),
            "--port",
            port,
            "--duration",
            repr(duration),
            "--seed",
            seed,
            "--output",
            arg("output"),
            # as plugrl-demo: a stalled link is closed after 10 s (demo.yaml's bridge answers within 5 s)
            "--feedback-timeout",
            "10",
        ],
        name="plugrl_demo_trainer",
        output="screen",
    )
    robot = Node(
        package="plugrl_ros",
        executable="demo_robot",
        name="plugrl_demo_robot",
        arguments=["--envs", str(envs), "--mode", mode, "--rate", repr(rate), "--seed", seed],
        output="screen",
    )
    bridge = Node(
        package="plugrl_ros",
        executable="bridge",
        name="plugrl_bridge",
        parameters=[
            config,
            {
                "trainer.uri": f"ws://127.0.0.1:{port}",
                "envs": [f"reacher{i}" for i in range(envs)],
                "control.mode": mode,
                "control.rate_hz": rate,
            },
        ],
        output="screen",
        emulate_tty=True,
    )
    # The run ends when any of the three exits: the trainer after writing its results, the bridge
    # after the trainer's stop (or a fatal error), the robot only on a failure. Shutdown then sends
    # the others SIGINT: the trainer still writes what it has, the bridge idles and closes with 1000.
    ends = [
        RegisterEventHandler(
            OnProcessExit(
                target_action=process,
                on_exit=[EmitEvent(event=Shutdown(reason=f"{name} exited: the demo run is over"))],
            )
        )
        for process, name in ((trainer, "the demo trainer"), (robot, "the demo robot"), (bridge, "the bridge"))
    ]
    return [trainer, robot, bridge, *ends]


def generate_launch_description():
    return LaunchDescription(
        [
            DeclareLaunchArgument("envs", default_value="2", description="number of simulated reachers"),
            DeclareLaunchArgument(
                "mode",
                default_value="lockstep",
                choices=["lockstep", "timer"],
                description="lockstep: step per command (simulator); timer: fixed-rate loop (real-robot-like)",
            ),
            DeclareLaunchArgument("rate", default_value="20.0", description="timer mode: control rate in Hz"),
            DeclareLaunchArgument("duration", default_value="180", description="seconds of training"),
            DeclareLaunchArgument("port", default_value="8000", description="the demo trainer's port"),
            DeclareLaunchArgument("seed", default_value="0", description="seeds the reachers and the trainer"),
            DeclareLaunchArgument(
                "output", default_value="demo-output", description="where returns.png and summary.json go"
            ),
            DeclareLaunchArgument(
                "config",
                default_value=PathJoinSubstitution([FindPackageShare("plugrl_ros"), "config", "demo.yaml"]),
                description="the bridge's params file",
            ),
            OpaqueFunction(function=_demo),
        ]
    )
