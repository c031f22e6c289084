"""``plugrl-probe`` with ROS: the probe robot and a bridge as real processes, pointed at a trainer.

The trainer's metadata comes first, on a connection of its own (the protocol
lets a client close after the metadata): the probe robot and the bridge are
then configured with the action width and horizon the trainer announces, as
the headless probe is, so a mismatch they report is the trainer's, not ours.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import subprocess

from plugrl_ros import executables, stop_request
from plugrl_ros.protocol.client import (
    ClientSettings,
    CloseKind,
    ConnectFailed,
    Event,
    FrameReceived,
    Notice,
    TrainerClient,
)
from plugrl_ros.protocol.codec import unpackb
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.messages import Metadata, parse_metadata
from plugrl_ros.shipped import shipped_file
from plugrl_ros.tools.probe_robot import namespace

log = logging.getLogger("plugrl_ros.probe")

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2
_STOP_TIMEOUT_S = 10.0


class MetadataUnavailable(Exception):
    """The trainer's metadata could not be read; the message says why."""


async def read_metadata(settings: ClientSettings) -> Metadata | None:
    """Connect, read the trainer's metadata and close with 1000; None if a stop was requested first.

    A trainer that cannot be reached is retried (with the client's backoff) until it can, or Ctrl-C.
    """
    found: list[Metadata] = []
    problems: list[str] = []

    def on_event(event: Event) -> None:
        if isinstance(event, FrameReceived):
            if not found and not problems:
                try:
                    found.append(parse_metadata(unpackb(event.frame)))
                except ProtocolError as exc:
                    problems.append(f"the trainer's first message is not valid metadata: {exc}")
            client.stop()
        elif isinstance(event, ConnectFailed):
            log.warning("cannot reach the trainer: %s; retrying in %.1f s", event.detail, event.retry_in_s)
        elif isinstance(event, Notice):
            log.warning("%s", event.text)

    client = TrainerClient(settings, on_event)
    with stop_request.calling_in_loop(asyncio.get_running_loop(), client.stop):
        kind = await client.run()
    if problems:
        raise MetadataUnavailable(problems[0])
    if found:
        return found[0]
    if kind is CloseKind.FATAL:
        raise MetadataUnavailable(f"fatal: {client.fatal_detail}")
    if kind is CloseKind.STOP:
        raise MetadataUnavailable("the trainer finished its run (plugrl-server-stop) before sending its metadata")
    return None  # stopped by Ctrl-C/SIGTERM


def bridge_command(args: argparse.Namespace, config: str, action_dim: int, horizon: int | None = None) -> list[str]:
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
        "control.action_dim": str(action_dim),
        "control.action_horizon": str(horizon) if horizon else "",
        "episode.max_steps": str(args.max_episode_steps),
        "actions.probe.slice": f"[0, {action_dim}]",
    }
    command = executables.command("plugrl_ros.node.bridge_main", "--ros-args", "--params-file", config)
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


def _stop(process: subprocess.Popen) -> int:
    """SIGINT (never -9: DDS leaves shared-memory files behind), then SIGTERM, then kill."""
    for send in (lambda: process.send_signal(signal.SIGINT), process.terminate, process.kill):
        if process.poll() is not None:
            break
        send()
        try:
            process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            continue
    return process.wait()


def run_deployment(args: argparse.Namespace, client: ClientSettings) -> int:
    """Read the trainer's metadata, start the probe robot and the bridge; the bridge's exit status."""
    if args.steps is not None:
        log.error("--steps needs --headless (the bridge runs until the trainer stops it)")
        return EXIT_USAGE
    stop_request.install()
    try:
        metadata = asyncio.run(read_metadata(client))
    except MetadataUnavailable as exc:
        log.error("%s", exc)
        return EXIT_FATAL
    if metadata is None:
        log.info("stopped before the trainer's metadata arrived")
        return EXIT_OK
    log.info("trainer: %s", metadata.describe() or "{} (announces nothing)")
    action_dim = metadata.action_dim or args.action_dim
    if action_dim is None:
        log.error("the trainer does not announce action_dim; pass --action-dim")
        return EXIT_FATAL
    if args.action_dim is not None and args.action_dim != action_dim:
        log.warning("the trainer announces action_dim %d: --action-dim %d is not used", action_dim, args.action_dim)
    config = str(shipped_file("config", "probe.yaml"))
    # Their own sessions: a Ctrl-C reaches them only through here, the bridge first (it idles the
    # actuators and closes the connection with 1000), then the robot.
    robot = subprocess.Popen(robot_command(args, action_dim), start_new_session=True)
    bridge: subprocess.Popen | None = None
    try:
        bridge = subprocess.Popen(
            bridge_command(args, config, action_dim, metadata.action_horizon), start_new_session=True
        )
        interrupt = bridge.send_signal
        with stop_request.waking(lambda: interrupt(signal.SIGINT)):  # the bridge passes it on in order
            bridge.wait()
    finally:
        code = EXIT_FATAL if bridge is None else _stop(bridge)
        robot_code = _stop(robot)
    if robot_code != 0:
        log.error("the probe robot exited with status %d", robot_code)
        return code or EXIT_FATAL
    return code
