"""The params files and ``-p`` overrides on the command line, read before ROS 2 reads them.

ROS 2 stops at a mistake in a params file with a traceback that names a line
number at best (an empty list, a list mixing 1 and 1.5, a key with no value),
and it silently keeps the first value of a key given twice with different
types (``rate_hz: 20.0`` in the file, ``-p control.rate_hz:=abc``). Reading
the same sources first lets the bridge name the key instead; the node then
checks that every value it was given arrived (:func:`check_arrival`).

Pure Python: no rclpy here, so it runs before ``rclpy.init``.
"""

from __future__ import annotations

import array
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from plugrl_ros.ros.params import ConfigError

PARAMS_FILE = "--params-file"
PARAM_FLAGS = ("-p", "--param")
ROS_ARGS = "--ros-args"
END_OF_ROS_ARGS = "--"
PARAMETERS_KEY = "ros__parameters"
NODE_SECTION_HINT = "name the section '/**' (every node) or the node's name, e.g. 'plugrl_bridge'"


@dataclass(frozen=True)
class ParamSource:
    """The values one params file section or one ``-p`` gives, flattened to dotted names.

    ``node`` is the section's node-name pattern as written ("/**",
    "plugrl_bridge", "/lab/*"), or ``None`` for a ``-p`` that names no node;
    ``origin`` is the file's path or the ``-p`` argument.
    """

    origin: str
    node: str | None
    values: Mapping[str, Any]
    from_file: bool = False

    def applies_to(self, node_fqn: str) -> bool:
        return self.node is None or node_pattern_matches(self.node, node_fqn)


def read_param_sources(argv: Sequence[str]) -> list[ParamSource]:
    """Every params file section and ``-p`` override in ``argv``'s ROS arguments, in command-line order.

    Raises :class:`ConfigError` naming the key (or the file) for what ROS 2
    would refuse without saying where: an unreadable file, broken YAML, a
    section without ``ros__parameters``, a key with no value, an empty list,
    or a list mixing types.
    """
    sources: list[ParamSource] = []
    for flag, value in _ros_arguments(argv):
        if flag == PARAMS_FILE:
            sources.extend(_file_sources(value))
        else:
            sources.append(_override_source(flag, value))
    return sources


def check_arrival(sources: Sequence[ParamSource], node_fqn: str, received: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` when the node did not get what its sources give it.

    Two cases: params files were given but none of their sections applies to
    this node (a section named ``bridge:``), and a key given with different
    types whose last value ROS 2 dropped.
    """
    files = [s for s in sources if s.from_file]
    if files and not any(s.applies_to(node_fqn) for s in files):
        sections = ", ".join(sorted({repr(s.node) for s in files}))
        raise ConfigError(
            PARAMS_FILE,
            sorted({s.origin for s in files}),
            f"no section applies to this node ({node_fqn}); the file has {sections}: {NODE_SECTION_HINT}",
        )
    given: dict[str, list[tuple[str, Any]]] = {}
    for source in sources:
        if source.applies_to(node_fqn):
            for key, value in source.values.items():
                given.setdefault(key, []).append((source.origin, value))
    for key, values in given.items():
        kinds = {_kind(v) for _, v in values}
        last_origin, last = values[-1]
        if len(kinds) > 1 and key in received and not _same(received[key], last):
            each = "; ".join(f"{origin} gives {v!r} ({_kind(v)})" for origin, v in values)
            fix = "write numbers with a decimal point, e.g. 50.0" if kinds == {"int", "float"} else "give one type"
            raise ConfigError(
                key,
                last,
                f"ROS 2 kept {received[key]!r} instead of this value from {last_origin}, because the key is "
                f"given with different types ({each}): {fix}",
            )


def node_pattern_matches(pattern: str, node_fqn: str) -> bool:
    """Whether a params file section named ``pattern`` applies to the node ``node_fqn`` ("/ns/name").

    As ROS 2 matches them: a name without a leading slash is absolute, ``*``
    stands for one name (or part of one), ``**`` for any number of namespaces.
    """
    absolute = pattern if pattern.startswith("/") else f"/{pattern}"
    regex = ""
    for part in re.split(r"(/\*\*|\*)", absolute):
        if part == "/**":
            regex += "(/[^/]+)*"
        elif part == "*":
            regex += "[^/]*"
        else:
            regex += re.escape(part)
    return re.fullmatch(regex, node_fqn) is not None


# -- reading -----------------------------------------------------------------------------


def _ros_arguments(argv: Sequence[str]) -> list[tuple[str, str]]:
    """The (flag, value) pairs of params files and overrides inside ``--ros-args ... [--]`` blocks."""
    found: list[tuple[str, str]] = []
    inside = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == ROS_ARGS:
            inside = True
        elif arg == END_OF_ROS_ARGS:
            inside = False
        elif inside and (arg == PARAMS_FILE or arg in PARAM_FLAGS) and i + 1 < len(argv):
            found.append((arg, argv[i + 1]))
            i += 1
        i += 1
    return found


def _file_sources(path: str) -> list[ParamSource]:
    try:
        with open(path, encoding="utf-8") as stream:
            document = yaml.safe_load(stream)
    except OSError as exc:
        raise ConfigError(PARAMS_FILE, path, f"cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(PARAMS_FILE, path, f"not valid YAML: {_one_line(exc)}") from None
    if document is None:
        return []
    if not isinstance(document, dict):
        raise ConfigError(PARAMS_FILE, path, f"expected node sections ({NODE_SECTION_HINT}) at the top")
    sources = []
    for node, section in document.items():
        parameters = section.get(PARAMETERS_KEY) if isinstance(section, dict) else None
        if not isinstance(parameters, dict):
            found = sorted(map(str, section)) if isinstance(section, dict) else section
            allowed = f"in {path}, a node section must hold '{PARAMETERS_KEY}:' with the parameters under it"
            raise ConfigError(f"{node}", found, allowed)
        values: dict[str, Any] = {}
        _flatten(parameters, "", values)
        sources.append(ParamSource(path, str(node), values, from_file=True))
    return sources


def _override_source(flag: str, rule: str) -> ParamSource:
    name, separator, text = rule.partition(":=")
    if not separator or not name:
        raise ConfigError(flag, rule, "expected name:=value")
    node, _, key = name.rpartition(":")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(key, text, f"the value of {flag} is not valid YAML: {_one_line(exc)}") from None
    values: dict[str, Any] = {}
    if isinstance(value, dict):
        _flatten(value, key, values)
    else:
        _check_value(key, value)
        values[key] = value
    return ParamSource(f"{flag} {rule}", node or None, values)


def _flatten(tree: Mapping[Any, Any], prefix: str, out: dict[str, Any]) -> None:
    for name, value in tree.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, dict):
            _flatten(value, key, out)
        else:
            _check_value(key, value)
            out[key] = value


def _check_value(key: str, value: Any) -> None:
    """What a ROS 2 parameter can hold: a scalar, or a non-empty list of scalars of one type."""
    if value is None:
        raise ConfigError(key, value, 'the key has no value: give one ("" for an empty string) or leave the key out')
    if not isinstance(value, list):
        return
    if not value:
        allowed = (
            'the list must not be empty (one robot without a namespace: [""])'
            if key == "envs"
            else "ROS 2 parameters cannot be empty lists: leave the key out for its default"
        )
        raise ConfigError(key, value, allowed)
    if any(v is None or isinstance(v, (list, dict)) for v in value):
        raise ConfigError(key, value, "a list may hold only numbers, strings or true/false")
    kinds = {_kind(v) for v in value}
    if kinds == {"int", "float"}:
        raise ConfigError(
            key, value, "ROS 2 needs one type per list: write every number with a decimal point, e.g. [-3.0, 3.1]"
        )
    if len(kinds) > 1:
        raise ConfigError(key, value, f"ROS 2 needs one type per list; this one mixes {', '.join(sorted(kinds))}")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, list):
        return "list of " + "/".join(sorted({_kind(v) for v in value})) if value else "list"
    return type(value).__name__


def _same(received: Any, given: Any) -> bool:
    """Equal as parameters: 50 and 50.0 are, True and 1 are not."""
    if isinstance(given, list):
        if isinstance(received, (str, bytes)) or not isinstance(received, (Sequence, array.array)):
            return False
        return len(received) == len(given) and all(_same(r, g) for r, g in zip(received, given))
    if isinstance(received, bool) or isinstance(given, bool):
        return isinstance(received, bool) and isinstance(given, bool) and received == given
    return received == given


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
