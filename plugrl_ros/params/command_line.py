"""Naming the key when rcl refuses or silently drops a parameter from the command line.

rcl reads every parameter. Where it stops, it names a file and a line
(``Sequence should be of same type ... at line_num 12``), or keeps a params
file's value over a ``-p`` override of another type without a word. These
helpers turn that into an error naming the key:

* :func:`explain_refusal`: rcl refused the command line; the key on the line
  it names (found in the file's YAML structure, never its values, so any
  file rcl reads, such as launch_ros's ``!!python/tuple`` lists, is read),
  and what to write instead;
* :func:`override_rules` and :func:`params_files`: the ``-p`` overrides and
  params files on the command line, to ask rcl what each override gives and
  to name a file none of whose sections is for the node;
* :func:`file_sections`: the node sections a params file has.

Pure Python: no rclpy here.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Sequence
from typing import Any

import yaml

from plugrl_ros.params.section import ConfigError
from plugrl_ros.ros_args import split_ros_args

PARAMS_FILE = "--params-file"
PARAM_FLAGS = ("-p", "--param")
PARAMETERS_KEY = "ros__parameters"
NODE_SECTION_HINT = "name the section '/**' (every node) or the node's name, e.g. 'plugrl_bridge'"
LIST_TYPES = (
    "ROS 2 needs one type per list: in a list of numbers write every number with a decimal point, "
    "e.g. [-3.0, 3.1]; in a list of names quote any that ROS 2 reads as a number or as true/false "
    "(y, n, yes, no, on, off)"
)
NO_VALUE = 'the key has no value: give one ("" for an empty string) or leave the key out'


class SourceText(str):
    """A value as written in the file: shown without quotes (``[1, 2.5]``, not ``'[1, 2.5]'``)."""

    def __repr__(self) -> str:
        return str(self)


def override_rules(argv: Sequence[str]) -> list[str]:
    """The ``name:=value`` rules of every ``-p``/``--param`` inside ``--ros-args``, in order."""
    return [value for flag, value in _ros_arguments(argv) if flag in PARAM_FLAGS]


def params_files(argv: Sequence[str]) -> list[str]:
    """The ``--params-file`` paths inside ``--ros-args``, in order."""
    return [value for flag, value in _ros_arguments(argv) if flag == PARAMS_FILE]


def rule_key(rule: str) -> str:
    """The parameter an override rule sets: ``plugrl_bridge:control.rate_hz:=50`` sets ``control.rate_hz``."""
    return rule.partition(":=")[0].rpartition(":")[2]


def file_sections(path: str) -> list[str]:
    """The top-level section names of a params file (empty if it cannot be read as a map)."""
    try:
        with open(path, encoding="utf-8") as stream:
            root = yaml.compose(stream, Loader=yaml.SafeLoader)  # structure only: no value is constructed
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(root, yaml.MappingNode):
        return []
    return [key.value for key, _ in root.value if isinstance(key, yaml.ScalarNode)]


def explain_refusal(message: str) -> ConfigError | None:
    """The key and the fix for an error rcl raised reading the command line, or None if it names none.

    ``message`` is rclpy.init's exception text, e.g. "Couldn't parse params file:
    '--params-file b.yaml'. Error: No value at line 3, at .../parse.c:258".
    """
    found = re.search(r"Couldn't parse params file: '--params-file (.*?)'\. Error: (.*)", message, re.S)
    if found:
        return _file_refusal(found[1], _reason(found[2]))
    found = re.search(r"Couldn't parse parameter override rule: '(\S+) (.*?)'\. Error: (.*)", message, re.S)
    if found:
        return _rule_refusal(found[1], found[2], _reason(found[3]))
    return None


# -- rcl's refusals -------------------------------------------------------------------------


def _reason(text: str) -> str:
    """rcl's reason without the source locations it appends (", at /src/parse.c:391")."""
    return re.sub(r"(, at \S+:\d+)+\s*$", "", " ".join(text.split()))


def _rule_refusal(flag: str, rule: str, reason: str) -> ConfigError:
    key = rule_key(rule)
    if ":=" not in rule or not key:
        return ConfigError(flag, rule, "expected name:=value")
    value = rule.partition(":=")[2]
    if not value.strip():
        return ConfigError(key, SourceText(value), NO_VALUE)
    if reason.startswith("Sequence should be of same type"):
        return ConfigError(key, SourceText(value), LIST_TYPES)
    if reason.startswith("Unknown YAML event"):
        allowed = f"a {flag} value is one value or a list; set each key of a map by its dotted name ({flag} {key}.x:=1)"
        return ConfigError(key, SourceText(value), allowed)
    return ConfigError(key, SourceText(value), f"the value of {flag} is not valid YAML as ROS 2 reads it ({reason})")


def _file_refusal(path: str, reason: str) -> ConfigError:
    if reason.startswith("Error opening YAML file"):
        try:
            with open(path, encoding="utf-8"):
                pass
        except OSError as exc:
            return ConfigError(PARAMS_FILE, path, f"cannot read it: {exc.strerror or exc}")
        return ConfigError(PARAMS_FILE, path, f"ROS 2 cannot open it ({reason})")
    line = re.search(r"line(?:_num)? (\d+)", reason)
    where = f"{path}, line {line[1]}" if line else path
    if reason.startswith("Error parsing a"):
        return ConfigError(PARAMS_FILE, path, f"not valid YAML near line {line[1] if line else '?'}")
    entry = _entry_at(path, int(line[1])) if line else None
    if entry is None:
        return ConfigError(PARAMS_FILE, path, f"ROS 2 cannot read it: {reason}")
    keys, value, mapping = entry
    if reason.startswith("Cannot have a value before ros__parameters") or (
        reason.startswith("Sequences cannot be key") and PARAMETERS_KEY not in keys
    ):
        return _node_section_refusal(path, keys, value, mapping)
    name = ".".join(keys[keys.index(PARAMETERS_KEY) + 1 :]) if PARAMETERS_KEY in keys else ".".join(keys)
    if reason.startswith("No value"):
        return ConfigError(name, None, f"{NO_VALUE} ({where})")
    if reason.startswith("Sequence should be of same type"):
        return ConfigError(name, value, f"{LIST_TYPES} ({where})")
    if reason.startswith("Sequences cannot be key"):
        return ConfigError(name, value, f"a list may hold only numbers, strings or true/false ({where})")
    return ConfigError(name, value, f"ROS 2 cannot read it: {reason} ({where})")


def _node_section_refusal(path: str, keys: list[str], value: Any, mapping: list[str] | None) -> ConfigError:
    """A node section without ``ros__parameters`` (or a misspelt one), named with what it holds."""
    allowed = f"in {path}, a node section must hold '{PARAMETERS_KEY}:' with the parameters under it"
    if not keys:
        return ConfigError(PARAMS_FILE, path, f"expected node sections ({NODE_SECTION_HINT}) at the top")
    misspelt = difflib.get_close_matches(PARAMETERS_KEY, keys, n=1)
    if misspelt:
        at = keys.index(misspelt[0])
        node = "/".join(keys[:at]) or keys[0]
        return ConfigError(node, [misspelt[0]], f"{allowed}; did you mean '{PARAMETERS_KEY}' for '{misspelt[0]}'?")
    if len(keys) == 1:
        return ConfigError(keys[0], value, allowed)
    return ConfigError("/".join(keys[:-1]), mapping, allowed)


def _entry_at(path: str, line: int) -> tuple[list[str], Any, list[str] | None] | None:
    """The innermost key whose entry spans ``line`` (1-based), its value as written, and its siblings' names."""
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # structure only: tags (!!python/tuple) stay unread
    except (OSError, yaml.YAMLError):
        return None
    if root is None:
        return None
    if not isinstance(root, yaml.MappingNode):
        return [], None, None
    target = line - 1
    best: tuple[tuple[int, int], list[str], Any, list[str]] | None = None
    for keys, key_node, value_node, siblings in _entries(root, []):
        if key_node.start_mark.line <= target <= max(value_node.end_mark.line, key_node.start_mark.line):
            rank = (len(keys), key_node.start_mark.line)
            if best is None or rank > best[0]:
                written = text[value_node.start_mark.index : value_node.end_mark.index].strip()
                best = (rank, keys, SourceText(written) if written else None, siblings)
    return None if best is None else (best[1], best[2], best[3])


def _entries(node: yaml.MappingNode, keys: list[str]) -> Iterator[tuple[list[str], Any, Any, list[str]]]:
    siblings = [str(k.value) for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
    for key_node, value_node in node.value:
        path = [*keys, str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"]
        yield path, key_node, value_node, siblings
        if isinstance(value_node, yaml.MappingNode):
            yield from _entries(value_node, path)


def _ros_arguments(argv: Sequence[str]) -> list[tuple[str, str]]:
    """The (flag, value) pairs of params files and overrides inside ``--ros-args ... [--]`` blocks."""
    ros = split_ros_args(argv)[1]
    found: list[tuple[str, str]] = []
    i = 0
    while i < len(ros):
        if (ros[i] == PARAMS_FILE or ros[i] in PARAM_FLAGS) and i + 1 < len(ros):
            found.append((ros[i], ros[i + 1]))
            i += 1
        i += 1
    return found
