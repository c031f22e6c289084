"""Reading one section of the bridge's parameters, with errors that name the key.

ROS 2 flattens a params file into dotted names; the bridge folds them back
into nested dicts and hands each section to the code that understands it.
A :class:`Section` is that code's view: typed getters that coerce what is
safe to coerce (an int where a float is wanted) and otherwise raise a
:class:`ConfigError` with the full dotted key, the value given and what is
allowed. Each key's default, range and choices come from its declaration
(:mod:`plugrl_ros.params.declarations`), and every value read is recorded
(:attr:`Section.used`) so the node can declare the configuration it runs
with. :meth:`Section.finish` then rejects any key nobody read, so a typo
fails at startup instead of being silently ignored.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from plugrl_ros.params.declarations import PER_TYPE, Spec, spec_for

_MISSING: Any = object()
MISSING = _MISSING  # a key that was not given, as a ConfigError shows it


class ConfigError(Exception):
    """A user mistake in the configuration: names the key, the value, what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        if value is _MISSING:
            shown = "(missing)"
        elif isinstance(value, Mapping) and value:
            shown = "{" + ", ".join(f"{name}: ..." for name in value) + "}"  # the keys say enough
        else:
            shown = repr(value)
        super().__init__(f"{key}: got {shown}; {allowed}")
        self.key = key
        self.value = value
        self.allowed = allowed


class Section:
    """The parameters under one dotted prefix, read through typed getters."""

    def __init__(self, values: Mapping[str, Any], prefix: str, used: dict[str, Any] | None = None) -> None:
        self._values = dict(values)
        self.prefix = prefix
        self._read: set[str] = set()
        self.used: dict[str, Any] = {} if used is None else used  # dotted key -> value read (shared by subsections)

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def has(self, name: str) -> bool:
        return name in self._values

    def names(self) -> list[str]:
        return list(self._values)

    def values(self) -> dict[str, Any]:
        """A copy of this section's raw values (to build another reader over them)."""
        return dict(self._values)

    def _get(self, name: str, default: Any, kind: str) -> tuple[Any, Spec]:
        """The value of ``name`` (given, else ``default`` for a per-type key, else the declared one) and its Spec."""
        key = self.key(name)
        spec = spec_for(key)
        assert spec is not None, f"{key} is read but not declared in plugrl_ros.params.declarations"
        assert spec.kind == kind, f"{key} is declared as {spec.kind} but read as {kind}"
        assert default is _MISSING or spec.default is PER_TYPE, f"{key}: its default belongs in its declaration"
        self._read.add(name)
        value = self._values.get(name, _MISSING)
        if value is _MISSING:
            if default is not _MISSING:
                value = default
            elif spec.has_default:
                value = list(spec.default) if isinstance(spec.default, list) else spec.default
            else:
                raise ConfigError(key, _MISSING, "this key is required")
        self.used[key] = value
        return value, spec

    def section(self, name: str, required: bool = False) -> Section:
        """A nested section (``{}`` if absent and not required)."""
        self._read.add(name)
        value = self._values.get(name, _MISSING if required else {})
        if value is _MISSING:
            raise ConfigError(self.key(name), _MISSING, "this key is required")
        if not isinstance(value, Mapping):
            raise ConfigError(self.key(name), value, "expected a map of keys")
        return Section(value, self.key(name), self.used)

    def str(self, name: str, default: Any = _MISSING, choices: Sequence[str] | None = None) -> str:
        value, spec = self._get(name, default, "str")
        if not isinstance(value, str):
            raise ConfigError(self.key(name), value, "expected a string")
        choices = choices or spec.choices
        if choices and value not in choices:
            raise ConfigError(self.key(name), value, "allowed: " + ", ".join(c or '""' for c in choices))
        return value

    def bool(self, name: str, default: Any = _MISSING) -> bool:
        value, _ = self._get(name, default, "bool")
        if not isinstance(value, bool):
            raise ConfigError(self.key(name), value, "expected true or false")
        return value

    def int(self, name: str, default: Any = _MISSING) -> int:
        """An integer within its declared range."""
        value, spec = self._get(name, default, "int")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.key(name), value, "expected an integer")
        _check_range(self.key(name), value, spec)
        return value

    def float(self, name: str, default: Any = _MISSING) -> float:
        """A finite number (an integer is taken as one) within its declared range."""
        value, spec = self._get(name, default, "float")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(self.key(name), value, "expected a finite number")
        value = float(value)
        _check_range(self.key(name), value, spec)
        return value

    def str_list(self, name: str, default: Any = _MISSING, nonempty: bool = False) -> list[str]:
        value, _ = self._get(name, default, "str list")
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise ConfigError(self.key(name), value, "expected a list of strings")
        items = list(value)
        if not all(isinstance(v, str) for v in items):
            raise ConfigError(self.key(name), value, "expected a list of strings")
        if nonempty and not items:
            raise ConfigError(self.key(name), value, "the list must not be empty")
        return items

    def float_list(self, name: str, default: Any = _MISSING, length: int | None = None) -> list[float]:
        """A list of numbers; a single number is accepted and repeated ``length`` times."""
        value, _ = self._get(name, default, "float or float list")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and length is not None:
            value = [value] * length
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise ConfigError(self.key(name), value, "expected a number or a list of numbers")
        items = list(value)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in items):
            raise ConfigError(self.key(name), value, "expected finite numbers")
        if length is not None and len(items) != length:
            raise ConfigError(self.key(name), value, f"expected {length} numbers (one per action element)")
        return [float(v) for v in items]

    def int_list(self, name: str, default: Any = _MISSING, length: int | None = None) -> list[int]:
        value, _ = self._get(name, default, "int list")
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise ConfigError(self.key(name), value, "expected a list of integers")
        items = list(value)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            raise ConfigError(self.key(name), value, "expected a list of integers")
        if length is not None and len(items) != length:
            raise ConfigError(self.key(name), value, f"expected {length} integers")
        return items

    def tree(self, name: str) -> dict[str, Any]:
        """A nested map of values a message type checks (an actuator's ``defaults``), each leaf recorded as read.

        Its keys are field names, not parameters of the bridge's own: the caller checks them against the type.
        """
        section = self.section(name)
        values = section.values()
        self._record_leaves(values, section.prefix)
        return values

    def _record_leaves(self, values: Mapping[str, Any], prefix: str) -> None:
        for name, value in values.items():
            key = f"{prefix}.{name}"
            if isinstance(value, Mapping):
                self._record_leaves(value, key)
                continue
            spec = spec_for(key)
            assert spec is not None and spec.kind == "value", f"{key} is read as a field value but not declared so"
            self.used[key] = value

    def finish(self) -> None:
        """Reject keys nobody read: a misspelt key must not be silently ignored."""
        self.check_known(self._read)

    def check_known(self, names: Iterable[str]) -> None:
        """Reject any key not in ``names``, before reading (so a misspelt section is named as such)."""
        known = sorted(set(names))
        unknown = sorted(set(self._values) - set(known))
        if unknown:
            close = difflib.get_close_matches(unknown[0], known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                self.key(unknown[0]),
                self._values[unknown[0]],
                f"unknown key under {self.prefix or 'the root'}; {hint}known keys: {', '.join(known)}",
            )


def _check_range(key: str, value: float, spec: Spec) -> None:
    if spec.positive and value <= 0:
        raise ConfigError(key, value, "must be greater than 0")
    if spec.minimum is not None and value < spec.minimum:
        raise ConfigError(key, value, f"must be at least {spec.minimum}")
    if spec.maximum is not None and value > spec.maximum:
        raise ConfigError(key, value, f"must be at most {spec.maximum}")


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Fold dotted parameter names back into nested dicts."""
    root: dict[str, Any] = {}
    for name, value in flat.items():
        parts = name.split(".")
        node = root
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(".".join(parts[: i + 1]), child, "is a value and also has keys below it")
            node = child
        if isinstance(node.get(parts[-1]), dict):
            raise ConfigError(name, value, "is a value and also has keys below it")
        node[parts[-1]] = value
    return root
