"""The bridge's executable (``ros2 run plugrl_ros bridge``): Ctrl-C is safe from its first moment.

This module imports nothing heavy: the stop handlers are in place before
rclpy and the bridge are imported (see :mod:`plugrl_ros.executables`), and
``--help`` answers at once.
"""

from __future__ import annotations

import sys

from plugrl_ros.executables import start
from plugrl_ros.ros_args import without_ros_args

EXIT_USAGE = 2
CHECK_CONFIG = "--check-config"


def usage() -> str:
    """How to start the bridge, and where its parameters are documented."""
    from plugrl_ros.shipped import shipped_file

    try:
        reference = str(shipped_file("config", "bridge.yaml"))
        examples = str(shipped_file("config", "demo.yaml").parent)
    except FileNotFoundError:  # an install without its data files: name them as the sources do
        reference, examples = "config/bridge.yaml of the plugrl_ros sources", "config/"
    return f"""\
usage: plugrl-bridge --ros-args --params-file PARAMS.yaml [-p KEY:=VALUE ...] [-r __ns:=/NAMESPACE]
       plugrl-bridge --check-config PARAMS.yaml [MORE.yaml ...]
       ros2 run plugrl_ros bridge --ros-args --params-file PARAMS.yaml [-p KEY:=VALUE ...]
       ros2 launch plugrl_ros bridge.launch.py config:=PARAMS.yaml [server_uri:=ws://HOST:8000] [mode:=train|deploy]

The plugrl_ros bridge node: robots on ROS 2 topics become the envs of a PlugRL training run
(mode train), or are driven by an openpi-compatible policy server (mode deploy); every
transition can be recorded to MCAP. It takes no options of its own: everything is a ROS
parameter, read from a params file and -p overrides.

--check-config reads the params files as --params-file would (a later file's value wins),
resolves every message type and field path against the installed interfaces, and prints
each env's observation and action layout, without starting the bridge (exit status 0; 2 with
the reason when something does not resolve).

  every key, commented, with its default:  {reference}
  example params files:                     {examples}/*.yaml
  while it runs:                            ros2 param list /plugrl_bridge
                                            ros2 param describe /plugrl_bridge control.rate_hz
  its state:                                ros2 topic echo /diagnostics

A mistake in the parameters stops the bridge at startup with the key's full name, the
value given and what is allowed (exit status 2).
"""


def main(args: list[str] | None = None) -> int:
    """``ros2 run plugrl_ros bridge --ros-args --params-file bridge.yaml``."""
    own = without_ros_args(sys.argv if args is None else args)[1:]
    if any(arg in ("-h", "--help") for arg in own):
        print(usage(), end="")
        return 0
    if own and own[0] == CHECK_CONFIG:
        from plugrl_ros.node.check_config import main as check_config

        return check_config(own[1:])
    if own:
        print(
            f"plugrl-bridge: takes no options of its own but {CHECK_CONFIG} (got {' '.join(own)}); its settings "
            "are ROS parameters: --ros-args --params-file PARAMS.yaml (see --help)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return start("plugrl_ros.node.process", args)


if __name__ == "__main__":
    sys.exit(main())
