"""Opt-in tests' access to a real ``ros2 launch`` / ``ros2 param`` toolchain, when one is present.

``launch``, ``launch_ros`` and ``ros2cli`` are not on PyPI, so CI has no
``ros2 launch``. A developer who has a ROS 2 install (or a toolchain built
over the wheels) names its environment script in ``PLUGRL_ROS2_LAUNCH_ENV``
(e.g. ``/opt/ros/jazzy/setup.bash``); the tests that need it skip with that
reason otherwise. The package is built with colcon into a workspace of the
test session's own, and every command runs in a fresh bash that sources the
toolchain and the workspace, with the test process's ``ROS_DOMAIN_ID``.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from harness import ROOT

ENV_VAR = "PLUGRL_ROS2_LAUNCH_ENV"


def toolchain_env() -> Path:
    """The toolchain's environment script, or a skip saying how to run these tests."""
    value = os.environ.get(ENV_VAR, "")
    if not value:
        pytest.skip(f"needs a ros2 launch toolchain: set {ENV_VAR} to its env.sh (or a ROS 2 setup.bash)")
    path = Path(value)
    if not path.is_file():
        pytest.fail(f"{ENV_VAR}={value} is not a file")
    return path


class Workspace:
    """A colcon workspace holding this package, built with the toolchain."""

    def __init__(self, env_sh: Path, root: Path) -> None:
        self.env_sh = env_sh
        self.root = root

    def script(self, command: str) -> str:
        """``command`` after sourcing the toolchain and this workspace, in this process's ROS domain."""
        setup = f"source {shlex.quote(str(self.env_sh))}"
        if (self.root / "install" / "setup.bash").exists():
            setup += f" && source {shlex.quote(str(self.root / 'install' / 'setup.bash'))}"
        domain = os.environ.get("ROS_DOMAIN_ID", "0")
        return f"{setup} && export ROS_DOMAIN_ID={domain} && {command}"

    def run(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``command`` to its end; its stdout and stderr together in ``.stdout``."""
        return subprocess.run(
            ["bash", "-c", self.script(command)],
            check=False,  # the caller reads the output and the code
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            cwd=self.root,
        )

    @contextmanager
    def launched(self, command: str, log: Path) -> Iterator[subprocess.Popen[str]]:
        """``command`` (a ``ros2 launch ...``) in a process group of its own, output to ``log``.

        Left running at the end of the block, it gets what a terminal's Ctrl-C
        sends: SIGINT to the whole group.
        """
        with open(log, "w") as out:
            proc = subprocess.Popen(
                ["bash", "-c", self.script(f"exec {command}")],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=self.root,
                start_new_session=True,
            )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def build_workspace(root: Path) -> Workspace:
    """This package built with colcon (symlinked sources) under ``root``, with the toolchain."""
    env_sh = toolchain_env()
    (root / "src").mkdir(parents=True, exist_ok=True)
    link = root / "src" / "plugrl_ros"
    if not link.exists():
        link.symlink_to(ROOT)
    workspace = Workspace(env_sh, root)
    built = workspace.run("colcon build --symlink-install", timeout=600)
    assert built.returncode == 0, built.stdout[-3000:]
    return workspace
