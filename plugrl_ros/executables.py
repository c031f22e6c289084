"""The package's executables, started so that Ctrl-C is safe from their first moment.

The console scripts (pip's and colcon's) call the functions here, and the
package starts its own subprocesses with :func:`command`. Either way the stop
handlers of :mod:`plugrl_ros.stop_request` are installed before the
executable's module is imported (rclpy, numpy, OpenCV: up to a second), and a
stop requested meanwhile ends the process with status 0 before it starts
anything. A subprocess never imports ``plugrl_ros`` from its current directory
(``python -m`` would, from a source checkout): it runs the installed package.
"""

from __future__ import annotations

import importlib
import sys

from plugrl_ros import stop_request

# What ``python -S -c`` runs for :func:`command`. Site initialisation (the venv, .pth files: a tenth
# of a second on a busy machine) comes after a handler that records a stop, not before (the builtin
# _signal: the signal module's own imports take as long); and the
# current directory that -c puts first on sys.path goes (before site would make it absolute), so
# the installed package is the one imported.
_BOOTSTRAP = """\
import _signal, sys
early = []
for signum in (_signal.SIGINT, _signal.SIGTERM):
    _signal.signal(signum, lambda signum, frame: early.append(signum))
if sys.path and sys.path[0] == "":
    del sys.path[0]
import site
site.main()
from plugrl_ros.executables import run_module
run_module(early)
"""


def command(module: str, *args: str) -> list[str]:
    """The command line that runs ``module`` as ``python -m`` would, from the installed package."""
    return [sys.executable, "-S", "-c", _BOOTSTRAP, module, *args]


def run_module(early: list[int]) -> None:
    """The subprocess side of :func:`command`: ``sys.argv`` is ``['-c', module, *args]``.

    ``early``: the signals that arrived before the package could be imported.
    """
    stop_request.install()
    if early:
        stop_request.request()
    module = sys.argv.pop(1)
    sys.argv[0] = module
    sys.exit(start(module))


def start(module: str, args: list[str] | None = None) -> int:
    """Install the stop handlers, import ``module`` and run its ``main``; its exit status."""
    stop_request.install()
    try:
        main = importlib.import_module(module).main
        if stop_request.requested():
            return 0  # stopped while starting: nothing runs yet that would need an orderly end
        return main() if args is None else main(args)
    finally:
        stop_request.ignore_from_now()


# the console scripts' functions below -> the module whose main() each runs
MODULES = {
    "demo": "plugrl_ros.demo.runner",
    "demo_robot": "plugrl_ros.demo.robot_node",
    "demo_trainer": "plugrl_ros.demo.trainer",
    "probe": "plugrl_ros.tools.probe",
    "probe_robot": "plugrl_ros.tools.probe_robot",
    "test_trainer": "plugrl_ros.tools.test_trainer",
    "test_policy_server": "plugrl_ros.tools.test_policy_server",
    "gym_robot": "plugrl_ros.gym.robot_node",
}


def demo() -> int:
    """``plugrl-demo``."""
    return start(MODULES["demo"])


def demo_robot() -> int:
    """``demo_robot`` / ``plugrl-demo-robot``."""
    return start(MODULES["demo_robot"])


def demo_trainer() -> int:
    """``demo_trainer`` / ``plugrl-demo-trainer``."""
    return start(MODULES["demo_trainer"])


def probe() -> int:
    """``plugrl-probe``."""
    return start(MODULES["probe"])


def probe_robot() -> int:
    """``probe_robot`` / ``plugrl-probe-robot``."""
    return start(MODULES["probe_robot"])


def test_trainer() -> int:
    """``test_trainer`` / ``plugrl-test-trainer``."""
    return start(MODULES["test_trainer"])


def test_policy_server() -> int:
    """``plugrl-test-policy-server``."""
    return start(MODULES["test_policy_server"])


def gym_robot() -> int:
    """``gym_robot`` / ``plugrl-gym-robot`` (the gym extra)."""
    return start(MODULES["gym_robot"])
