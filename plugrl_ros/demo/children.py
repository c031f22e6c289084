"""The demo's child processes: their command lines (the bridge as a user would start it, the robot, the scripted
person) and a child whose output goes to a log file."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path
from typing import IO

from plugrl_ros import executables, stop_request
from plugrl_ros.demo.robot_node import namespace
from plugrl_ros.shipped import shipped_file

STOP_TIMEOUT_S = 15.0
EPISODE_S = 3.0  # config/demo.yaml's episode.max_steps (60) at 20 Hz


def bridge_command(args: argparse.Namespace, config: Path, port: int) -> list[str]:
    """The bridge's command line: the shipped config plus this run's overrides, as a user would write them."""
    envs = ", ".join(f"'{namespace(i)}'" for i in range(args.envs))
    overrides = {
        "trainer.uri": f"ws://127.0.0.1:{port}",
        "envs": f"[{envs}]",
        "control.mode": args.mode,
        "control.rate_hz": repr(float(args.rate)),
    }
    if args.record:
        # absolute: the bridge may resolve a relative folder against another working directory
        overrides["record.path"] = str(Path(args.output).resolve())
    if args.mode == "timer":
        # The robot then runs in real time at --rate: keep episodes as long in seconds as the config's
        # max_steps are at its 20 Hz (in lockstep a step is always 0.05 s of simulated time).
        overrides["episode.max_steps"] = str(max(1, round(EPISODE_S * args.rate)))
    command = executables.command("plugrl_ros.node.bridge_main", "--ros-args", "--params-file", str(config))
    if args.teleop == "scripted":
        command += ["--params-file", str(shipped_file("config", "demo_intervention.yaml"))]
    for key, value in overrides.items():
        command += ["-p", f"{key}:={value}"]
    return command


def teleop_command(args: argparse.Namespace) -> list[str]:
    """The scripted person: a gamepad per reacher, helping during the run's first ``--teleop-minutes``."""
    return executables.command(
        "plugrl_ros.demo.teleop_node", "--envs", str(args.envs), "--minutes", repr(float(args.teleop_minutes))
    )


def deploy_bridge_command(
    args: argparse.Namespace, config: Path, port: int, horizon: int, execution: str = "switch"
) -> list[str]:
    """The bridge in deploy mode: the same config and robots, a policy server instead of the trainer."""
    envs = ", ".join(f"'{namespace(i)}'" for i in range(args.envs))
    overrides = {
        "mode": "deploy",
        "policy.uri": f"ws://127.0.0.1:{port}",
        "policy.action_horizon": str(horizon),
        "policy.execution.mode": execution,
        "envs": f"[{envs}]",
        "control.mode": "timer",  # deploy mode runs on the control timer; a lockstep robot steps per command
        "control.rate_hz": repr(float(args.rate)),
        "episode.max_steps": str(max(1, round(EPISODE_S * args.rate))),  # as long in seconds as in training
    }
    command = executables.command("plugrl_ros.node.bridge_main", "--ros-args", "--params-file", str(config))
    for key, value in overrides.items():
        command += ["-p", f"{key}:={value}"]
    return command


def robot_command(args: argparse.Namespace) -> list[str]:
    return executables.command(
        "plugrl_ros.demo.robot_node",
        "--envs",
        str(args.envs),
        "--mode",
        args.mode,
        "--rate",
        repr(float(args.rate)),
        "--seed",
        str(args.seed),
    )


class Child:
    """A ROS process whose output goes to a log file; stopped as a Ctrl-C stops it (stop_request.stop_child)."""

    def __init__(self, name: str, command: list[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log: IO[str] = open(log_path, "w")  # closed in stop()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # its own process group: a Ctrl-C in the terminal reaches it only through this demo, in order
        self.proc = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        code = stop_request.stop_child(self.proc, timeout)
        self._log.close()
        return code
