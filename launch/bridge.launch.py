"""Launch the plugrl_ros bridge node with a params file (all behaviour lives in the node)."""

from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from launch import LaunchDescription


def _bridge(context):
    parameters = [LaunchConfiguration("config").perform(context)]
    server_uri = LaunchConfiguration("server_uri").perform(context)
    if server_uri:
        parameters.append({"trainer.uri": server_uri})
    return [
        Node(
            package="plugrl_ros",
            executable="bridge",
            name="plugrl_bridge",
            namespace=LaunchConfiguration("namespace"),
            parameters=parameters,
            arguments=["--ros-args", "--log-level", LaunchConfiguration("log_level")],
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
            DeclareLaunchArgument("server_uri", default_value="", description="trainer URI; overrides trainer.uri"),
            DeclareLaunchArgument("namespace", default_value="", description="namespace of the bridge node"),
            DeclareLaunchArgument("log_level", default_value="info", description="debug, info, warn, error"),
            OpaqueFunction(function=_bridge),
        ]
    )
