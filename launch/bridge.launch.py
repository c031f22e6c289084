"""Launch the plugrl_ros bridge node with a params file (all behaviour lives in the node).

    ros2 launch plugrl_ros bridge.launch.py config:=my_robot.yaml [overlay:=more.yaml]
        [server_uri:=ws://host:8000] [mode:=train|deploy|teleop] [policy_uri:=ws://host:8000]
        [namespace:=robot1] [log_level:=debug|info|warn|error|fatal]

``overlay`` is a second params file read after ``config`` (its values win), as a
second ``--params-file`` is: e.g. config/demo_lerobot.yaml over config/demo.yaml.

``log_level`` is the bridge's own logger's level (ROS's internals stay at
info, or at the chosen level when it is quieter than info).
"""

import os

from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from launch import LaunchDescription

NODE_NAME = "plugrl_bridge"
LOG_LEVELS = ["debug", "info", "warn", "error", "fatal"]


class LaunchArgumentError(Exception):
    """A launch argument that cannot work; launch prints the message and ends."""


def _bridge(context):
    config = LaunchConfiguration("config").perform(context)
    if not os.path.isfile(config):
        raise LaunchArgumentError(f"config:={config}: no such params file")
    parameters = [config]
    overlay = LaunchConfiguration("overlay").perform(context)
    if overlay:
        if not os.path.isfile(overlay):
            raise LaunchArgumentError(f"overlay:={overlay}: no such params file")
        parameters.append(overlay)
    overrides = {}
    for argument, key in (("mode", "mode"), ("server_uri", "trainer.uri"), ("policy_uri", "policy.uri")):
        value = LaunchConfiguration(argument).perform(context)
        if value:  # "" leaves the params file's value
            overrides[key] = value
    if overrides:
        parameters.append(overrides)
    namespace = LaunchConfiguration("namespace").perform(context)
    level = LaunchConfiguration("log_level").perform(context)
    # the node's logger is named after its namespace and name: robot1/plugrl_bridge -> robot1.plugrl_bridge
    logger = ".".join([part for part in namespace.split("/") if part] + [NODE_NAME])
    log_args = ["--log-level", f"{logger}:={level}"]
    if LOG_LEVELS.index(level) > LOG_LEVELS.index("info"):
        log_args += ["--log-level", level]  # quieter than info: for everything in the process
    return [
        Node(
            package="plugrl_ros",
            executable="bridge",
            name=NODE_NAME,
            namespace=namespace,
            parameters=parameters,
            arguments=["--ros-args", *log_args],
            output="screen",
            emulate_tty=True,
        )
    ]


def generate_launch_description():
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                "config",
                default_value=PathJoinSubstitution([FindPackageShare("plugrl_ros"), "config", "bridge.yaml"]),
                description="the bridge's params file",
            ),
            DeclareLaunchArgument(
                "overlay", default_value="", description="a second params file, read after config (its values win)"
            ),
            DeclareLaunchArgument(
                "mode", default_value="", description="train, deploy or teleop; overrides the params file's mode"
            ),
            DeclareLaunchArgument("server_uri", default_value="", description="trainer URI; overrides trainer.uri"),
            DeclareLaunchArgument(
                "policy_uri", default_value="", description="policy server URI (deploy mode); overrides policy.uri"
            ),
            DeclareLaunchArgument("namespace", default_value="", description="namespace of the bridge node"),
            DeclareLaunchArgument(
                "log_level", default_value="info", choices=LOG_LEVELS, description="the bridge's log level"
            ),
            OpaqueFunction(function=_bridge),
        ]
    )
