"""Launch the demo the ROS way: the demo trainer, the simulated reachers and the bridge with config/demo.yaml.

    ros2 launch plugrl_ros demo.launch.py [envs:=2] [mode:=lockstep|timer] [rate:=20.0] [duration:=180]

The trainer ends the run after ``duration`` seconds, the bridge then exits by
itself, the trainer writes returns.png and summary.json into ``output`` and
exits, and that ends the launch. All behaviour lives in the executables.
"""

from launch.actions import DeclareLaunchArgument, EmitEvent, ExecuteProcess, OpaqueFunction, RegisterEventHandler
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import ExecutableInPackage, FindPackageShare

from launch import LaunchDescription


def _demo(context):
    def arg(name):
        return LaunchConfiguration(name).perform(context)

    envs = int(arg("envs"))
    mode = arg("mode")
    rate = float(arg("rate"))
    port = str(int(arg("port")))
    seed = str(int(arg("seed")))
    trainer = ExecuteProcess(
        cmd=[
            ExecutableInPackage("demo_trainer", "plugrl_ros"),
            "--port",
            port,
            "--duration",
            arg("duration"),
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
        arguments=["--envs", str(envs), "--mode", mode, "--rate", str(rate), "--seed", seed],
        output="screen",
    )
    bridge = Node(
        package="plugrl_ros",
        executable="bridge",
        name="plugrl_bridge",
        parameters=[
            LaunchConfiguration("config").perform(context),
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
    # The trainer exits last (after writing its results): then stop the robot too.
    end = RegisterEventHandler(
        OnProcessExit(target_action=trainer, on_exit=[EmitEvent(event=Shutdown(reason="the demo run ended"))])
    )
    return [trainer, robot, bridge, end]


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
