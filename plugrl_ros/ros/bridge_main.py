"""The bridge's executable: signals are handled from its first moment, before the heavy imports."""

from __future__ import annotations

import signal
import sys

from plugrl_ros.ros import stop_request


def _stop_before_start(signum: int, frame: object) -> None:
    # Nothing runs yet: no actuator to idle, no connection to close. The
    # bridge installs its own handlers (which do both) once it can.
    stop_request.request()
    raise SystemExit(0)


def main(args: list[str] | None = None) -> int:
    """``ros2 run plugrl_ros bridge --ros-args --params-file bridge.yaml``."""
    signal.signal(signal.SIGINT, _stop_before_start)
    signal.signal(signal.SIGTERM, _stop_before_start)
    from plugrl_ros.ros.bridge_node import main as run_bridge  # rclpy and the rest: about half a second

    if stop_request.requested():
        return 0  # the handler's SystemExit was lost in an import (see stop_request)
    return run_bridge(args)


if __name__ == "__main__":
    sys.exit(main())
