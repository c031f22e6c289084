"""``plugrl-bridge --check-config FILE [FILE ...]``: a params file checked against the installed interfaces.

The files are read by rcl, in the order ``--params-file`` takes them (a later file's value wins), for a
node named ``plugrl_bridge``, exactly as the bridge reads them; the configuration is then parsed as at
startup, so every message type, field path, default and reset request is resolved against the
interfaces installed here. Nothing runs: no trainer link, no subscription, no timer. The rcl node that
rcl needs to hand over the parameters lives in a context of its own, with discovery off where the ROS
distribution supports it, and is gone before the layout is printed.

Exit status 0 when everything resolves (each env's observation and action layout is printed), 2 with
the reason when something does not.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from plugrl_ros.params.command_line import PARAMS_FILE, explain_refusal
from plugrl_ros.params.section import ConfigError

EXIT_OK = 0
EXIT_CONFIG = 2
NODE_NAME = "plugrl_bridge"


def check(files: Sequence[str]) -> int:
    """Check ``files`` as the bridge would read them; print the layout or the reason. The exit status."""
    # Before rclpy reads the environment: this check talks to nobody.
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "OFF"
    import rclpy
    from rclpy.context import Context
    from rclpy.node import Node
    from rclpy.signals import SignalHandlerOptions

    from plugrl_ros.ros.node_parameters import configure

    argv = ["plugrl-bridge", "--ros-args", *(arg for path in files for arg in (PARAMS_FILE, path))]
    context = Context()
    try:
        rclpy.init(args=argv, context=context, signal_handler_options=SignalHandlerOptions.NO)
    except RuntimeError as exc:  # rcl refused a file: name the key, as the bridge does
        error = explain_refusal(str(exc))
        print(f"[plugrl_bridge] configuration error: {error or ' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        node = Node(NODE_NAME, context=context, enable_rosout=False, start_parameter_services=False)
        try:
            config = configure(node, argv)
        finally:
            node.destroy_node()
    except ConfigError as exc:
        print(f"[plugrl_bridge] configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    finally:
        rclpy.try_shutdown(context=context)
    print(describe(config, files))
    return EXIT_OK


def describe(config: Any, files: Sequence[str]) -> str:
    """Each env's observation and action layout, as the bridge would run it."""
    from plugrl_ros.ros.config import env_topic
    from plugrl_ros.ros.sinks import GoalSink

    control = config.control
    rate = f" at {control.rate_hz:g} Hz" if control.mode == "timer" else ""
    lines = [
        f"{', '.join(files)}: OK (mode {config.mode}, control {control.mode}{rate}, {len(config.envs)} env(s))",
    ]
    for index, namespace in enumerate(config.envs):
        lines.append(f"env {index} ({namespace or 'no namespace'}):")
        lines.append("  observation:")
        for image in config.images:
            shaping = image.source.converter.shaping
            size = "x".join(str(v) for v in shaping.resize) if shaping.resize else "as published"
            shape = f"uint8 image {size}, {shaping.channels} channel(s)"
            lines.append(f"    images.{image.name}: {shape} <- {_source(image.source, namespace, env_topic)}")
        for state in config.states:
            width = sum(part.converter.width or 0 for part in state.parts)
            sized = all(part.converter.width is not None for part in state.parts)
            lines.append(f"    states.{state.name}: float64[{width if sized else 'as published'}]")
            for part in state.parts:
                lines.append(f"      {_source(part, namespace, env_topic)}{_selection(part.converter)}")
        if config.text.source is not None:
            lines.append(f"    text <- {_source(config.text.source, namespace, env_topic)}")
        elif config.text.prompt:
            lines.append(f"    text: {config.text.prompt!r}")
        width = config.action_width_needed
        lines.append(f"  action: {'at least ' if config.takes_whole_action else ''}{width} value(s) per step")
        for action in config.actions:
            span = "[0, all)" if action.stop is None else f"[{action.start}, {action.stop})"
            target = env_topic(namespace, action.topic)
            how = "goals to action server" if isinstance(action.sink, GoalSink) else "published on"
            lines.append(f"    {span} {action.key}: {how} {target} ({action.type_name}){_selection(action.sink)}")
    return "\n".join(lines)


def _source(topic: Any, namespace: str, env_topic: Any) -> str:
    return f"{env_topic(namespace, topic.topic)} ({topic.type_name})"


def _selection(converter: Any) -> str:
    """What a converter takes from its messages: joints, field paths, beams."""
    said = []
    if getattr(converter, "joints", None):
        said.append(f"joints {', '.join(converter.joints)}")
    fields = getattr(converter, "fields", None)
    if fields:
        said.append(", ".join(".".join(f) if isinstance(f, tuple) else f for f in fields))
    if getattr(converter, "beams", None):
        said.append(f"{converter.beams} beams ({converter.reduce})")
    return f": {'; '.join(said)}" if said else ""


def main(files: Sequence[str]) -> int:
    if not files:
        print("plugrl-bridge --check-config: give the params files, in --params-file order", file=sys.stderr)
        return EXIT_CONFIG
    return check(files)
