"""The params files and ``-p`` overrides on the command line, read before ROS 2 reads them.

ROS 2 stops at a mistake in a params file with a traceback that names a line
number at best (a list mixing 1 and 1.5, a key with no value, an empty list),
and it silently keeps the first value of a key given twice with different
types (``rate_hz: 20.0`` in the file, ``-p control.rate_hz:=abc``). Reading
the same sources first lets the bridge name the key instead:

* :func:`read_param_sources`, before ``rclpy.init``: what ROS 2 refuses in
  any section;
* :func:`check_for_node`, once the node's name is known: what it refuses only
  in the node's own sections (an empty list), and files with no section for it;
* :func:`check_arrival`, once the node has its parameters: values dropped.

Scalars are read as ROS 2 reads them (``1e3`` is a number, ``y`` and ``on``
are true, ``null`` is text), not as YAML 1.1 would.

Pure Python: no rclpy here.
"""

from __future__ import annotations

import array
import difflib
import math
import re
import sys
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
    section without ``ros__parameters``, a key with no value, or a list of
    mixed types or of lists.
    """
    sources: list[ParamSource] = []
    for flag, value in _ros_arguments(argv):
        if flag == PARAMS_FILE:
            sources.extend(_file_sources(value))
        else:
            sources.append(_override_source(flag, value))
    return sources


def has_empty_list(sources: Sequence[ParamSource]) -> bool:
    """Whether any source gives ``[]`` (which only the node it applies to refuses)."""
    return any(value == [] for source in sources for value in source.values.values())


def check_for_node(sources: Sequence[ParamSource], node_fqn: str) -> None:
    """Raise :class:`ConfigError` for what only this node would trip over, before it is created.

    Params files none of whose sections applies to it (a section named
    ``bridge:``), and an empty list in a section that does (ROS 2 cannot type
    it and fails declaring it, naming nothing).
    """
    files = [s for s in sources if s.from_file]
    if files and not any(s.applies_to(node_fqn) for s in files):
        sections = ", ".join(sorted({repr(s.node) for s in files}))
        raise ConfigError(
            PARAMS_FILE,
            sorted({s.origin for s in files}),
            f"no section applies to this node ({node_fqn}); the file has {sections}: {NODE_SECTION_HINT}",
        )
    for source in sources:
        if not source.applies_to(node_fqn):
            continue
        for key, value in source.values.items():
            if value == []:
                allowed = (
                    'the list must not be empty (one robot without a namespace: [""])'
                    if key == "envs"
                    else "ROS 2 parameters cannot be empty lists: leave the key out for its default"
                )
                raise ConfigError(key, value, allowed)


def check_arrival(sources: Sequence[ParamSource], node_fqn: str, received: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for a key given with different types whose last value ROS 2 dropped."""
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
            first_origin, first = values[0]
            raise ConfigError(
                key,
                last,
                f"ROS 2 kept {received[key]!r} instead of this value from {last_origin}, because the key is "
                f"given with different types ({each}): give it as {_kind(first)}, as {first_origin} does",
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
            document = yaml.load(stream, Loader=_RosLoader)  # safe: a SafeLoader typing scalars as ROS 2 does
    except OSError as exc:
        raise ConfigError(PARAMS_FILE, path, f"cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(PARAMS_FILE, path, f"not valid YAML: {_one_line(exc)}") from None
    if document is None:
        return []
    if not isinstance(document, dict):
        raise ConfigError(PARAMS_FILE, path, f"expected node sections ({NODE_SECTION_HINT}) at the top")
    sources: list[ParamSource] = []
    _node_sections(path, document, "", sources)
    return sources


def _node_sections(path: str, tree: Mapping[Any, Any], prefix: str, out: list[ParamSource]) -> None:
    """The node sections of a params file; a namespace may nest its nodes (``lab: {bridge: {...}}``)."""
    for name, section in tree.items():
        node = f"{prefix}/{name}" if prefix else str(name)
        parameters = section.get(PARAMETERS_KEY) if isinstance(section, dict) else None
        if isinstance(parameters, dict):
            values: dict[str, Any] = {}
            _flatten(parameters, "", values)
            out.append(ParamSource(path, node, values, from_file=True))
            continue
        allowed = f"in {path}, a node section must hold '{PARAMETERS_KEY}:' with the parameters under it"
        if not isinstance(section, dict) or not section:
            raise ConfigError(node, section, allowed)
        misspelt = difflib.get_close_matches(PARAMETERS_KEY, map(str, section), n=1)
        if misspelt or not all(isinstance(v, dict) for v in section.values()):
            hint = f"; did you mean '{PARAMETERS_KEY}' for '{misspelt[0]}'?" if misspelt else ""
            raise ConfigError(node, sorted(map(str, section)), allowed + hint)
        _node_sections(path, section, node, out)  # a namespace holding node sections


def _override_source(flag: str, rule: str) -> ParamSource:
    name, separator, text = rule.partition(":=")
    if not separator or not name:
        raise ConfigError(flag, rule, "expected name:=value")
    node, _, key = name.rpartition(":")
    try:
        value = yaml.load(text, Loader=_RosLoader)  # safe: a SafeLoader typing scalars as ROS 2 does
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
    """What ROS 2 reads in any section: a scalar, or a list of scalars of one type."""
    if value is None:
        raise ConfigError(key, value, 'the key has no value: give one ("" for an empty string) or leave the key out')
    if not isinstance(value, list) or not value:
        return  # an empty list is refused only by the node it is for (check_for_node)
    if any(v is None or isinstance(v, (list, dict)) for v in value):
        raise ConfigError(key, value, "a list may hold only numbers, strings or true/false")
    kinds = {_kind(v) for v in value}
    if kinds == {"int", "float"}:
        raise ConfigError(
            key, value, "ROS 2 needs one type per list: write every number with a decimal point, e.g. [-3.0, 3.1]"
        )
    if kinds == {"bool", "string"}:
        raise ConfigError(
            key, value, "ROS 2 needs one type per list and reads y, n, yes, no, on, off as true/false: quote them"
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


# -- scalars as ROS 2 reads them ----------------------------------------------------------

_TRUE = frozenset({"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"})
_FALSE = frozenset({"n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"})
_C_INTEGER = re.compile(r"[+-]?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_C_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_C_HEX_FLOAT = re.compile(r"[+-]?0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+")
_C_SPECIAL = re.compile(r"[+-]?(inf|infinity|nan)", re.IGNORECASE)
_YAML_SPECIAL = {".inf": math.inf, ".Inf": math.inf, ".INF": math.inf, ".nan": math.nan, ".NaN": math.nan}
_YAML_SPECIAL |= {".NAN": math.nan, "-.inf": -math.inf, "-.Inf": -math.inf, "-.INF": -math.inf}
_YAML_SPECIAL |= {"+.inf": math.inf, "+.Inf": math.inf, "+.INF": math.inf}
_INT64 = (-(2**63), 2**63 - 1)


def ros_scalar(text: str) -> Any:
    """An unquoted scalar as ROS 2's params parser types it: bool, int64, double, or else text.

    ``""`` (a key with no value) gives ``None``: ROS 2 refuses it.
    """
    if text == "":
        return None
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    if _C_INTEGER.fullmatch(text):
        digits = text.lstrip("+-")
        base = 16 if digits[:2] in ("0x", "0X") else 8 if digits.startswith("0") and len(digits) > 1 else 10
        number = int(text, base)
        if _INT64[0] <= number <= _INT64[1]:
            return number
        return float(number)  # out of int64: ROS 2 reads it as a double
    if text in _YAML_SPECIAL:
        return _YAML_SPECIAL[text]
    if _C_SPECIAL.fullmatch(text):
        return float(text)
    if _C_HEX_FLOAT.fullmatch(text):
        number = float.fromhex(text)
        return text if math.isinf(number) else number
    if _C_DECIMAL.fullmatch(text):
        number = float(text)
        # Out of a double's normal range (strtod's ERANGE): ROS 2 keeps the text.
        inexact_tiny = abs(number) < sys.float_info.min and re.search(r"[1-9]", re.split(r"[eE]", text)[0])
        return text if math.isinf(number) or inexact_tiny else number
    return text


class _RosLoader(yaml.SafeLoader):
    """A safe YAML loader whose scalars are typed by :func:`ros_scalar` and whose keys stay text."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        mapping = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else self.construct_object(key_node, deep)
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping

    def construct_ros_scalar(self, node: yaml.ScalarNode) -> Any:
        return node.value if node.style else ros_scalar(node.value)  # quoted: always text


_RosLoader.yaml_implicit_resolvers = {}  # every scalar is text to YAML; ros_scalar types it
_RosLoader.add_constructor("tag:yaml.org,2002:str", _RosLoader.construct_ros_scalar)
