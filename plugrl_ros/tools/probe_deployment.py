"""``plugrl-probe`` with ROS: the probe robot and a bridge as real processes, pointed at a trainer."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

from plugrl_ros.shipped import shipped_file
from plugrl_ros.tools.probe_robot import namespace

_STOP_TIMEOUT_S = 10.0


def bridge_command(args: argparse.Namespace, config: str, action_dim: int) -> list[str]:
    """The bridge's command line: config/probe.yaml plus this run's overrides."""
    envs = ", ".join(f"'{namespace(i)}'" for i in range(args.envs))
    overrides = {
        "trainer.uri": args.server,
        "trainer.use_reuse": "false" if args.no_reuse else "true",
        "trainer.text_format": "list" if args.text_as_list else "array",
        "trainer.wait_for_next_run": "true" if args.wait_for_next_run else "false",
        "trainer.api_key_env": args.api_key_env,
        "trainer.ca_file": args.ca_file,
        "envs": f"[{envs}]",
        "control.mode": args.mode,
        "control.rate_hz": f"{float(args.rate)!r}",
        "control.replan_steps": str(args.replan_steps),
        "episode.max_steps": str(args.max_episode_steps),
        "actions.probe.slice": f"[0, {action_dim}]",
    }
    command = [sys.executable, "-m", "plugrl_ros.ros.bridge_main", "--ros-args", "--params-file", config]
    for key, value in overrides.items():
        if value != "":
            command += ["-p", f"{key}:={value}"]
    if args.quiet:
        command += ["--log-level", "warn"]
    return command


def _stop(process: subprocess.Popen) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def run_deployment(args: argparse.Namespace) -> int:
    """Start the probe robot and the bridge; the bridge's exit status."""
    if args.steps is not None:
        print("plugrl-probe: --steps needs --headless (the bridge runs until the trainer stops it)", file=sys.stderr)
        return 2
    action_dim = args.action_dim or 2
    config = str(shipped_file("config", "probe.yaml"))
    robot = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "plugrl_ros.tools.probe_robot",
            "--envs",
            str(args.envs),
            "--action-dim",
            str(action_dim),
        ]
    )
    bridge = subprocess.Popen(bridge_command(args, config, action_dim))
    try:
        code = bridge.wait()
    except KeyboardInterrupt:
        code = _stop(bridge)
    finally:
        _stop(bridge)
        _stop(robot)
    return code
