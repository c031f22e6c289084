"""Helpers for tests that run real processes: the test trainer in a thread, ROS processes, timeouts."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from plugrl_ros import executables
from plugrl_ros.tools import serving
from plugrl_ros.tools.test_trainer import Report, TestTrainer, TrainerSettings

ROOT = Path(__file__).resolve().parent.parent


class TrainerThread(serving.TrainerThread[Report]):
    """The protocol-checking test trainer, serving on its own event loop thread."""

    def __init__(self, settings: TrainerSettings) -> None:
        super().__init__(TestTrainer(settings), name="plugrl-test-trainer")
        self.settings = settings

    def report(self, timeout: float) -> Report:
        return self.result(timeout)


def ros_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: the installed package, as a user has it (never the checkout's path)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def python_module(module: str, *args: str) -> list[str]:
    """``python -m module`` as the package starts its own children: the installed package, not the cwd's."""
    return executables.command(module, *args)


class Child:
    """A child process whose output goes to a file (a full pipe would block it)."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None, session: bool = False) -> None:
        """``session``: in a process group of its own, for a terminal's Ctrl-C (SIGINT to the group)."""
        self._log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            command,
            env=env or ros_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=session,
        )

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 15.0) -> int:
        return stop(self.proc, timeout)

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read()


@contextmanager
def process(command: list[str], env: dict[str, str] | None = None, session: bool = False) -> Iterator[Child]:
    """A child process that is stopped with SIGINT (never -9: DDS leaves shm files) when the block ends."""
    child = Child(command, env, session)
    try:
        yield child
    finally:
        child.stop()


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def launch_arguments(launch_file: Path) -> set[str]:
    """The names a launch file declares with ``DeclareLaunchArgument`` (read, not run: no launch_ros here)."""
    import ast

    return {
        node.args[0].value
        for node in ast.walk(ast.parse(launch_file.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", "") == "DeclareLaunchArgument"
        and isinstance(node.args[0], ast.Constant)
    }


def launch_params_file(path: Path, node_name: str, params: dict) -> Path:
    """The params file launch_ros writes for ``Node(name=..., parameters=[params])``, at ``path``.

    As launch_ros.actions.Node does it: nested dicts flattened to dotted names
    and lists made tuples (normalize_parameters), then
    ``yaml.dump({node: {"ros__parameters": ...}}, default_flow_style=False)``,
    so every list comes out as a ``!!python/tuple`` block.
    """
    import yaml

    def flat(tree: dict, prefix: str = "") -> dict:
        out: dict = {}
        for name, value in tree.items():
            key = f"{prefix}.{name}" if prefix else name
            if isinstance(value, dict):
                out.update(flat(value, key))
            else:
                out[key] = tuple(value) if isinstance(value, list) else value
        return out

    with open(path, "w") as stream:
        yaml.dump({node_name: {"ros__parameters": flat(params)}}, stream, default_flow_style=False)
    return path


@contextmanager
def rcl_node(*ros_args: str):
    """A node named plugrl_bridge given ``ros_args`` as ``ros2 run`` passes them, in a context of its own.

    Yields ``(node, argv)``: rcl has parsed the arguments into the node's overrides.
    """
    import rclpy
    from rclpy.context import Context
    from rclpy.node import Node
    from rclpy.signals import SignalHandlerOptions

    argv = ["bridge", "--ros-args", *ros_args]
    context = Context()
    rclpy.init(args=argv, context=context, signal_handler_options=SignalHandlerOptions.NO)
    try:
        node = Node("plugrl_bridge", context=context, enable_rosout=False, start_parameter_services=False)
        try:
            yield node, argv
        finally:
            node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)
