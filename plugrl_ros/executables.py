"""The package's executables, started so that Ctrl-C is safe from their first statement.

Each executable is a small script that setup.py generates from :func:`script`
(not a console-script entry point: the wrappers pip and setuptools generate
import ``re``, ``importlib.metadata`` and the entry point's package first, a
second or more on a loaded robot computer, during which a Ctrl-C printed a
``KeyboardInterrupt`` traceback). Its first statements record SIGINT and
SIGTERM with the builtin ``_signal`` module; only then come the site packages
(it starts with ``python -S`` where the installer keeps that flag: colcon's
does, pip drops it), this module, and the executable's own module with its
heavy imports (rclpy, numpy, OpenCV). A stop requested meanwhile ends the
process with status 0 before it starts anything. What remains is Python's own
start-up before the script's first statement (about 15 ms with -S, 50 ms
with the site packages, on an idle 2-core machine).

The package starts its own subprocesses the same way, with :func:`command`,
and never imports ``plugrl_ros`` from its current directory (``python -m``
would, from a source checkout): it runs the installed package.
"""

from __future__ import annotations

import importlib
import sys

from plugrl_ros import stop_request

# executable -> the module whose main() it runs: a ROS name (ros2 run plugrl_ros NAME) and a plugrl-* name
EXECUTABLES = {
    "bridge": "plugrl_ros.node.bridge_main",
    "demo_robot": "plugrl_ros.demo.robot_node",
    "demo_teleop": "plugrl_ros.demo.teleop_node",
    "demo_trainer": "plugrl_ros.demo.trainer",
    "probe_robot": "plugrl_ros.tools.probe_robot",
    "test_trainer": "plugrl_ros.tools.test_trainer",
    "plugrl-bridge": "plugrl_ros.node.bridge_main",
    "plugrl-demo": "plugrl_ros.demo.runner",
    "plugrl-demo-robot": "plugrl_ros.demo.robot_node",
    "plugrl-demo-teleop": "plugrl_ros.demo.teleop_node",
    "plugrl-demo-trainer": "plugrl_ros.demo.trainer",
    "plugrl-probe": "plugrl_ros.tools.probe",
    "plugrl-probe-robot": "plugrl_ros.tools.probe_robot",
    "plugrl-test-policy-server": "plugrl_ros.tools.test_policy_server",
    "plugrl-test-trainer": "plugrl_ros.tools.test_trainer",
    "plugrl-record-info": "plugrl_ros.record.info",
    "plugrl-export": "plugrl_ros.record.export",
    # the gym extra (plugrl_ros[gym]): Gymnasium envs as robots
    "gym_robot": "plugrl_ros.gym.robot_main",
    "plugrl-gym-robot": "plugrl_ros.gym.robot_main",
    # the rllib extra (plugrl_ros[rllib]): an RLlib checkpoint's policy served for deploy mode
    "plugrl-policy-server": "plugrl_ros.tools.policy_server",
}

# The start of every executable and child process. Site initialisation (the venv, .pth files: a tenth of a
# second on a busy machine) comes after a handler that records a stop, not before (the builtin _signal: the
# signal module's own imports take as long); and the current directory that -c puts first on sys.path goes
# (before site would make it absolute), so the installed package is the one imported.
_BOOTSTRAP = """\
import _signal, sys
early = []
for signum in (_signal.SIGINT, _signal.SIGTERM):
    _signal.signal(signum, lambda signum, frame: early.append(signum))
if sys.path and sys.path[0] == "":
    del sys.path[0]
if "site" not in sys.modules:
    import site
    site.main()
from plugrl_ros.executables import run_module
run_module(early, {module!r})
"""


# Modules that may start Ray (plugrl-demo --trainer rllib) start with the site packages: Ray hands the
# interpreter's -S on to its worker processes, which then cannot import Ray, and ray.init waits for them forever.
RAY_DRIVERS = frozenset({"plugrl_ros.demo.runner"})


def _flags(module: str) -> list[str]:
    return [] if module in RAY_DRIVERS else ["-S"]


def script(name: str) -> str:
    """The text of executable ``name`` (setup.py writes it; the installer points ``#!python`` at its Python)."""
    module = EXECUTABLES[name]
    shebang = " ".join(["#!python", *_flags(module)])
    header = f"{shebang}\n# {name}: runs {module}.main(), with Ctrl-C safe from here on (plugrl_ros.executables)\n"
    return header + _BOOTSTRAP.format(module=module)


def command(module: str, *args: str) -> list[str]:
    """The command line that runs ``module`` as ``python -m`` would, from the installed package."""
    return [sys.executable, *_flags(module), "-c", _BOOTSTRAP.format(module=module), *args]


def run_module(early: list[int], module: str) -> None:
    """The bootstrap's end: run ``module``'s main and exit with its status.

    ``early``: the signals that arrived before the package could be imported.
    """
    stop_request.install()
    if early:
        stop_request.request()
    if sys.argv and sys.argv[0] == "-c":  # a child started by command(): named after its module
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
