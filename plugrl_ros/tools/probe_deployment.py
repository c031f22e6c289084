"""``plugrl-probe`` with ROS: the probe robot and a bridge as real processes, pointed at a trainer.

The probe connects once, as a client must: the bridge starts first (its
probe actuator takes the whole action, as wide as the trainer sends it), and
the trainer's metadata is read from the bridge's own /diagnostics. Only then
does the probe robot start, with the announced action width, so a mismatch it
reports is the trainer's, not ours. (Reading the metadata on a connection of
its own would show the trainer a client that connected and left: a public
conformance checker fails that, and a production trainer sees a stranger.)
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import threading

from plugrl_ros import executables, stop_request
from plugrl_ros.protocol.client import ClientSettings
from plugrl_ros.shipped import shipped_file
from plugrl_ros.tools.bridge_watch import BridgeWatch, Statuses
from plugrl_ros.tools.probe_robot import namespace

log = logging.getLogger("plugrl_ros.probe")

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2
_STOP_TIMEOUT_S = 10.0


def bridge_node_name() -> str:
    """The probe's bridge has a name of its own: a robot's real bridge may publish /diagnostics beside it."""
    return f"plugrl_probe_bridge_{os.getpid()}"


def bridge_command(args: argparse.Namespace, config: str, node_name: str) -> list[str]:
    """The bridge's command line: config/probe.yaml plus this run's overrides."""
    envs = ", ".join(f"'{namespace(i)}'" for i in range(args.envs))
    overrides = {
        "trainer.uri": args.server,
        "trainer.use_reuse": "false" if args.no_reuse else "true",
        "trainer.text_format": "list" if args.text_as_list else "array",
        "trainer.wait_for_next_run": "true" if args.wait_for_next_run else "false",
        "trainer.api_key_env": args.api_key_env,
        "trainer.ca_file": args.ca_file,
        "trainer.first_answer_timeout_s": f"{float(args.first_answer_timeout)!r}",
        "trainer.answer_timeout_s": f"{float(args.answer_timeout)!r}",
        "trainer.tcp_timeout_s": f"{float(args.tcp_timeout)!r}",
        "envs": f"[{envs}]",
        "control.mode": args.mode,
        "control.rate_hz": f"{float(args.rate)!r}",
        "control.replan_steps": str(args.replan_steps),
        # the width the robot expects, when the trainer does not say (the actuator applies whatever comes)
        "control.action_dim": str(args.action_dim) if args.action_dim else "",
        "episode.max_steps": str(args.max_episode_steps),
    }
    command = executables.command(
        "plugrl_ros.node.bridge_main", "--ros-args", "-r", f"__node:={node_name}", "--params-file", config
    )
    for key, value in overrides.items():
        if value != "":
            command += ["-p", f"{key}:={value}"]
    if args.quiet:
        command += ["--log-level", "warn"]
    return command


def robot_command(args: argparse.Namespace, action_dim: int) -> list[str]:
    return executables.command(
        "plugrl_ros.tools.probe_robot", "--envs", str(args.envs), "--action-dim", str(action_dim)
    )


class TrainerMetadata:
    """What the bridge named ``node_name`` reports of its trainer's metadata on /diagnostics, once it has it."""

    def __init__(self, node_name: str, arrived: threading.Event) -> None:
        self._entry = f"{node_name}: trainer"
        self._arrived = arrived
        self.values: dict[str, str] | None = None  # the trainer entry's values, once the metadata came

    def on_statuses(self, statuses: Statuses, received_at: float) -> None:
        del received_at
        entry = statuses.get(self._entry)
        if self.values is None and entry is not None and entry[1].get("metadata received") == "True":
            self.values = entry[1]
            self._arrived.set()

    @property
    def action_dim(self) -> int | None:
        text = (self.values or {}).get("trainer action_dim")
        return int(text) if text and text.isdigit() else None


def _stop(process: subprocess.Popen) -> int:
    """Stop a child as a Ctrl-C stops it (stop_request.stop_child); its exit status."""
    return stop_request.stop_child(process, _STOP_TIMEOUT_S)


def run_deployment(args: argparse.Namespace, client: ClientSettings) -> int:
    """Start the bridge, read the trainer's metadata from it, start the probe robot; the bridge's exit status."""
    del client  # the bridge's parameters carry the same link settings (see bridge_command)
    if args.steps is not None:
        log.error("--steps needs --headless (the bridge runs until the trainer stops it)")
        return EXIT_USAGE
    stop_request.install()
    config = str(shipped_file("config", "probe.yaml"))
    node_name = bridge_node_name()
    arrived = threading.Event()
    metadata = TrainerMetadata(node_name, arrived)
    watch = BridgeWatch(f"{node_name}_watch", metadata.on_statuses)
    # Their own sessions: a Ctrl-C reaches them only through here, the bridge first (it idles the
    # actuators and closes the connection with 1000), then the robot.
    bridge = subprocess.Popen(bridge_command(args, config, node_name), start_new_session=True)
    robot: subprocess.Popen | None = None
    robot_code = 0
    try:
        log.info("waiting for the trainer's metadata (through the bridge %s) to start the probe robot", node_name)
        # (polled: a signal handler must not take the lock an Event's waiter holds)
        while not arrived.wait(0.1) and bridge.poll() is None and not stop_request.requested():
            pass
        watch.close()
        if bridge.poll() is not None or stop_request.requested():
            return _stop(bridge)
        announced = metadata.action_dim
        action_dim = announced or args.action_dim
        if action_dim is None:
            log.error("the trainer does not announce action_dim; pass --action-dim")
            _stop(bridge)
            return EXIT_FATAL
        if args.action_dim is not None and announced is not None and args.action_dim != announced:
            log.warning("the trainer announces action_dim %d: --action-dim %d is not used", announced, args.action_dim)
        log.info("trainer: action_dim %d; starting %d probe env(s)", action_dim, args.envs)
        robot = subprocess.Popen(robot_command(args, action_dim), start_new_session=True)
        interrupt = bridge.send_signal
        with stop_request.waking(lambda: interrupt(signal.SIGINT)):  # the bridge passes it on in order
            bridge.wait()
    finally:
        watch.close()
        code = _stop(bridge)
        if robot is not None:
            robot_code = _stop(robot)
    if robot_code != 0:
        log.error("the probe robot exited with status %d", robot_code)
        return code or EXIT_FATAL
    return code
