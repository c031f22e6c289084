"""The bridge node's parameters: what rcl gave it, checked, parsed, and declared back read-only.

rcl parses the params files and ``-p`` overrides and matches their sections
to the node's name; rclpy hands the node the result as its parameter
overrides. The bridge reads only those: no second reading of any file. What
rcl accepts but the bridge must refuse is named here (an empty list, a
``-p`` value rcl dropped, a params file with no section for this node); the
rest is :func:`plugrl_ros.ros.config.load_config`'s job. Every key read is
then declared with its descriptor (:mod:`plugrl_ros.params.declarations`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rclpy.node import Node
from rclpy.parameter import Parameter

from plugrl_ros.params.command_line import (
    NODE_SECTION_HINT,
    PARAMS_FILE,
    file_sections,
    override_rules,
    params_files,
    rule_key,
)
from plugrl_ros.params.declarations import declare
from plugrl_ros.params.section import ConfigError
from plugrl_ros.ros.config import BridgeConfig, is_ros_owned, load_config
from plugrl_ros.ros_args import ROS_ARGS


def configure(node: Node, command_line: Sequence[str]) -> BridgeConfig:
    """The node's configuration from what rcl gave it; each key it reads is declared on ``node``, read-only.

    ``command_line`` is what ``rclpy.init`` read, to name a ``-p`` override or
    a params file when rcl dropped what it gave.
    """
    received = overrides(node)
    _check_empty_lists(received)
    _check_overrides_arrived(node, received, override_rules(command_line))
    values = {name: _python(p) for name, p in received.items()}
    if not any(not is_ros_owned(name) for name in values):
        _check_files_have_a_section(node, params_files(command_line))
    used: dict[str, Any] = {}
    config = load_config(values, used)
    declare(node, used)
    return config


def overrides(node: Node) -> dict[str, Parameter]:
    """The parameters rcl parsed for ``node`` (its params files' matching sections, then ``-p``).

    rclpy keeps them in ``Node._parameter_overrides`` (every release since
    Dashing): what ``automatically_declare_parameters_from_overrides`` would
    declare, and what ``declare_parameter`` takes a value from.
    """
    return dict(node._parameter_overrides)


def _python(parameter: Parameter) -> Any:
    value = parameter.value
    return list(value) if isinstance(value, (list, tuple)) or hasattr(value, "typecode") else value


def _check_empty_lists(received: dict[str, Parameter]) -> None:
    """rcl passes ``[]`` on untyped (NOT_SET); declaring it would fail naming nothing."""
    for name, parameter in received.items():
        if parameter.type_ == Parameter.Type.NOT_SET:
            allowed = (
                'the list must not be empty (one robot without a namespace: [""])'
                if name == "envs"
                else "ROS 2 parameters cannot be empty lists: leave the key out for its default"
            )
            raise ConfigError(name, [], allowed)


def _check_overrides_arrived(node: Node, received: dict[str, Parameter], rules: list[str]) -> None:
    """Refuse a ``-p`` value that rcl dropped for a params file's value of another type.

    rcl keeps a key's value from a params file when a later ``-p`` gives it
    another type it ranks lower (``rate_hz: 20.0`` then ``-p
    control.rate_hz:=fast``, or ``max_steps: 100`` then ``:=100.5``), and says
    nothing. To see what the overrides alone give, rcl reads them again for a
    node of the same name that ignores the rest of the command line.
    """
    if not rules:
        return
    alone = Node(
        node.get_name(),
        namespace=node.get_namespace(),
        context=node.context,
        cli_args=[ROS_ARGS, *(arg for rule in rules for arg in ("-p", rule))],
        use_global_arguments=False,
        enable_rosout=False,
        start_parameter_services=False,
    )
    try:
        given = overrides(alone)
    finally:
        alone.destroy_node()
    for name, parameter in given.items():
        kept = received.get(name)
        if kept is None or (kept.type_ == parameter.type_ and _python(kept) == _python(parameter)):
            continue
        rule = next((r for r in reversed(rules) if rule_key(r) == name), f"{name}:=...")
        kind = _kind(kept)
        raise ConfigError(
            name,
            _python(parameter),
            f"ROS 2 kept {_python(kept)!r} instead of this value from -p {rule}, because a params file gives "
            f"the key as {kind} and ROS 2 drops a later value of another type: give it as {kind}",
        )


def _kind(parameter: Parameter) -> str:
    names = {
        Parameter.Type.BOOL: "true/false",
        Parameter.Type.INTEGER: "an integer",
        Parameter.Type.DOUBLE: "a number with a decimal point",
        Parameter.Type.STRING: "a string",
    }
    return names.get(parameter.type_, "a list of one type")


def _check_files_have_a_section(node: Node, files: list[str]) -> None:
    """No parameter arrived although params files were given: their sections name other nodes."""
    if not files:
        return
    sections = sorted({section for path in files for section in file_sections(path)})
    shown = ", ".join(repr(s) for s in sections) or "no section"
    raise ConfigError(
        PARAMS_FILE,
        files,
        f"no section applies to this node ({node.get_fully_qualified_name()}); the file has {shown}: "
        f"{NODE_SECTION_HINT}",
    )
