"""Launch the plugrl_ros bridge node with a params file (all behaviour lives in the node)."""

from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

from launch import LaunchDescription


def _bridge(context):
    parameters = [LaunchConfiguration("config").perform(context)]
    overrides = {}
    for argument, key in (("mode", "mode"), ("server_uri", "trainer.uri"), ("policy_uri", "policy.uri")):
        value = LaunchConfiguration(argument).perform(context)
        if value:  # "" leaves the params file's value
            overrides[key] = value
    if overrides:
        parameters.append(overrides)
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
            DeclareLaunchArgument(
                "mode", default_value="", description="train or deploy; overrides the params file's mode"
            ),
            DeclareLaunchArgument("server_uri", default_value="", description="trainer URI; overrides trainer.uri"),
            DeclareLaunchArgument(
                "policy_uri", default_value="", description="policy server URI (deploy mode); overrides policy.uri"
            ),
            DeclareLaunchArgument("namespace", default_value="", description="namespace of the bridge node"),
            DeclareLaunchArgument("log_level", default_value="info", description="debug, info, warn, error"),
            OpaqueFunction(function=_bridge),
        ]
    )
