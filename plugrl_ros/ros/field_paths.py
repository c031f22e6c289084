"""Field paths into any ROS interface type, resolved by the type's own introspection (no per-type code).

A path such as ``pose.position.x``, ``position[0:3]``, ``data[2]`` or
``cells[*].pressure`` is checked once, at startup, against the message
class's ``SLOT_TYPES`` (rosidl_parser's definitions, which every generated
Python class carries), and compiled into a reader (message -> float64
values) and a writer (values -> message fields). What cannot be checked at
startup is the length of a sequence: a path into one declares the width it
reads (``ranges[0:360]``), and a message whose sequence is shorter raises
:class:`ShortMessage` at run time (never a silent pad: a policy fed zeros
for missing beams would take them for obstacles).
"""

from __future__ import annotations

import array
import copy
import difflib
import importlib
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from rosidl_parser.definition import (
    AbstractGenericString,
    AbstractNestedType,
    AbstractSequence,
    Array,
    BasicType,
    BoundedSequence,
    NamespacedType,
)

from plugrl_ros.params.section import ConfigError
from plugrl_ros.ros.conversion import ShortMessage

FLOAT_TYPES = ("float", "double", "long double")
INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "uint8": (0, 2**8 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}
NUMERIC_TYPES = (*FLOAT_TYPES, *INT_RANGES, "boolean")
INTERFACE_KINDS = ("msg", "srv", "action")

_SEGMENT = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)(?:\[(\*|\d+|\d*:\d*)\])?$")


def interface_class(type_name: str, kind: str, key: str) -> type:
    """The class of ``type_name`` ("pkg/Type" or "pkg/<kind>/Type"), imported as rosidl generated it.

    ConfigError (naming ``key``) if the package is not installed or has no such type.
    """
    parts = type_name.split("/")
    if len(parts) == 3 and parts[1] in INTERFACE_KINDS:
        if parts[1] != kind:
            raise ConfigError(key, type_name, f"allowed: a {kind} type, written pkg/Type or pkg/{kind}/Type")
        parts = [parts[0], parts[2]]
    if len(parts) != 2 or not all(parts):
        raise ConfigError(key, type_name, f"an interface type written pkg/Type or pkg/{kind}/Type")
    package, name = parts
    try:
        module = importlib.import_module(f"{package}.{kind}")
    except ImportError:
        raise ConfigError(
            key, type_name, f"no installed ROS package '{package}' has {kind} types (is it built and sourced?)"
        ) from None
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        known = sorted(n for n in dir(module) if not n.startswith("_") and isinstance(getattr(module, n), type))
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {package}/{close[0]}? " if close else ""
        raise ConfigError(key, type_name, f"{package}/{kind} has no type '{name}'; {hint}it has: {', '.join(known)}")
    return cls


def has_interface_kind(type_name: str, kind: str) -> bool:
    """``type_name`` is written with the ``kind`` infix ("pkg/action/Type")."""
    parts = type_name.split("/")
    return len(parts) == 3 and parts[1] == kind


def type_label(cls: type) -> str:
    """ "pkg/msg/Type" of a generated class, as ``ros2 interface show`` takes it."""
    module = cls.__module__.split(".")
    return f"{module[0]}/{module[1] if len(module) > 1 else 'msg'}/{cls.__name__}"


def fields_of(cls: type) -> dict[str, Any]:
    """name -> rosidl_parser type of each field of a generated message class, in declaration order."""
    return dict(zip(cls.get_fields_and_field_types(), cls.SLOT_TYPES, strict=True))


def _class_of(namespaced: NamespacedType) -> type:
    module = importlib.import_module(".".join(namespaced.namespaces))
    return getattr(module, namespaced.name)


def _is_numeric(slot: Any) -> bool:
    return isinstance(slot, BasicType) and slot.typename in NUMERIC_TYPES


def describe_fields(cls: type) -> str:
    """The fields a path may take in ``cls``: numbers, numeric arrays and nested messages, with their types."""
    names = cls.get_fields_and_field_types()
    usable = []
    for name, slot in fields_of(cls).items():
        element = slot.value_type if isinstance(slot, AbstractNestedType) else slot
        if _is_numeric(element) or isinstance(element, NamespacedType):
            usable.append(f"{name} ({names[name]})")
    return ", ".join(usable) or "none"


@dataclass(frozen=True)
class _Selector:
    """What ``name[...]`` selects from an array or a sequence: ``start:stop`` (``*`` and an index are ranges too)."""

    start: int
    stop: int

    @property
    def width(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class FieldPath:
    """One checked path: how many values it holds, and how to read them from (or write them into) a message."""

    text: str
    width: int
    read: Callable[[Any], np.ndarray]
    write: Callable[[Any, np.ndarray], None]
    scalar_attribute: bool  # a plain dotted path to one number: readable with operator.attrgetter


def compile_path(cls: type, path: str, key: str, element_defaults: Mapping[str, Any] | None = None) -> FieldPath:
    """``path`` checked against ``cls`` (ConfigError naming ``key``, the path and the fields there are).

    ``element_defaults``: the ``defaults`` map of the message (nested, no indices); a sequence element a
    writer creates (``points[0]``) takes the defaults given for the sequence's element type there.
    """
    if not path or any(not _SEGMENT.match(part) for part in path.split(".")):
        raise ConfigError(
            key, path, "a field path like 'pose.position.x', 'position[0:3]', 'data[2]' or 'cells[*].pressure'"
        )
    return _compile(cls, path.split("."), path, key, [], element_defaults or {})


def _compile(
    cls: type, parts: list[str], path: str, key: str, walked: list[str], defaults: Mapping[str, Any]
) -> FieldPath:
    match = _SEGMENT.match(parts[0])
    assert match is not None
    name, selection = match.group(1), match.group(2)
    rest = parts[1:]
    fields = fields_of(cls)
    where = f"'{'.'.join(walked)}' ({type_label(cls)})" if walked else type_label(cls)
    if name not in fields:
        raise ConfigError(key, path, f"{where} has no field '{name}'; its fields: {describe_fields(cls)}")
    slot = fields[name]
    here = [*walked, parts[0]]
    sub_defaults = defaults.get(name, {}) if isinstance(defaults.get(name), Mapping) else {}
    if isinstance(slot, AbstractNestedType):
        return _compile_nested(cls, name, slot, selection, rest, path, key, here, sub_defaults)
    if selection is not None:
        raise ConfigError(key, path, f"'{name}' in {where} is a {cls.get_fields_and_field_types()[name]}, no array")
    if isinstance(slot, NamespacedType):
        inner_cls = _class_of(slot)
        if not rest:
            raise ConfigError(
                key,
                path,
                f"'{path}' is a message ({type_label(inner_cls)}); continue it with one of its fields: "
                f"{describe_fields(inner_cls)}",
            )
        inner = _compile(inner_cls, rest, path, key, here, sub_defaults)
        get = operator.attrgetter(name)
        return FieldPath(
            path,
            inner.width,
            lambda msg: inner.read(get(msg)),
            lambda msg, values: inner.write(get(msg), values),
            inner.scalar_attribute,
        )
    if not _is_numeric(slot):
        raise ConfigError(
            key,
            path,
            f"'{name}' in {where} is a {cls.get_fields_and_field_types()[name]}, not a number; "
            f"numeric fields there: {describe_fields(cls)}",
        )
    if rest:
        raise ConfigError(key, path, f"'{'.'.join(here)}' is a number; it has no field '{rest[0]}'")
    convert = _scalar_setter(slot.typename)
    get = operator.attrgetter(name)
    return FieldPath(
        path,
        1,
        lambda msg: np.array((get(msg),), dtype=np.float64),
        lambda msg, values: setattr(msg, name, convert(values[0])),
        True,
    )


def _compile_nested(
    cls: type,
    name: str,
    slot: AbstractNestedType,
    selection: str | None,
    rest: list[str],
    path: str,
    key: str,
    here: list[str],
    element_defaults: Mapping[str, Any],
) -> FieldPath:
    """A path through an array or a sequence field: its selector, then the elements' numbers or fields."""
    shown = cls.get_fields_and_field_types()[name]
    sequence = isinstance(slot, AbstractSequence)
    bound = slot.size if isinstance(slot, Array) else slot.maximum_size if isinstance(slot, BoundedSequence) else None
    element = slot.value_type
    if selection is None:
        if sequence:
            raise ConfigError(
                key,
                path,
                f"'{name}' is a {shown}, of variable length: give the width the path reads, e.g. "
                f"'{name}[0:4]' (or one element, '{name}[0]')",
            )
        if isinstance(element, NamespacedType):
            raise ConfigError(key, path, f"'{name}' is a {shown}: select elements, e.g. '{name}[*].<field>'")
        selection = "*"
    if selection == "*":
        if sequence:
            raise ConfigError(
                key,
                path,
                f"'{name}' is a {shown}, of variable length: '[*]' has no width; give one, e.g. '{name}[0:4]'",
            )
        assert bound is not None
        selector = _Selector(0, bound)
    elif ":" in selection:
        low, high = selection.split(":")
        start = int(low) if low else 0
        if not high and bound is None:
            raise ConfigError(
                key, path, f"'{name}' is a {shown}: give the slice's stop (its width), e.g. '{name}[0:4]'"
            )
        stop = int(high) if high else bound
        assert stop is not None
        selector = _Selector(start, stop)
    else:
        selector = _Selector(int(selection), int(selection) + 1)
    if selector.width <= 0:
        raise ConfigError(key, path, f"'{name}[{selection}]' selects nothing: expected [start:stop] with start < stop")
    if bound is not None and selector.stop > bound:
        raise ConfigError(
            key, path, f"'{name}' is a {shown}: it holds at most {bound} values, the path reads to {selector.stop}"
        )
    get = operator.attrgetter(name)
    start, stop = selector.start, selector.stop
    if _is_numeric(element):
        if rest:
            raise ConfigError(key, path, f"'{'.'.join(here)}' holds numbers; they have no field '{rest[0]}'")
        return FieldPath(
            path,
            selector.width,
            _numbers_reader(get, start, stop, sequence, path),
            _numbers_writer(name, element.typename, start, stop, sequence),
            False,
        )
    if not isinstance(element, NamespacedType):
        raise ConfigError(key, path, f"'{name}' is a {shown}, not numbers; numeric fields: {describe_fields(cls)}")
    element_cls = _class_of(element)
    if not rest:
        raise ConfigError(
            key,
            path,
            f"'{'.'.join(here)}' selects messages ({type_label(element_cls)}); continue with one of "
            f"their fields: {describe_fields(element_cls)}",
        )
    inner = _compile(element_cls, rest, path, key, here, element_defaults)
    make_element = message_factory(element_cls, element_defaults, key)
    return FieldPath(
        path,
        selector.width * inner.width,
        _elements_reader(get, inner, start, stop, sequence, path),
        _elements_writer(name, inner, start, stop, sequence, make_element),
        False,
    )


def _short(path: str, have: int, stop: int) -> ShortMessage:
    return ShortMessage(f"'{path}' reads {stop} elements but the message has {have}")


def _numbers_reader(get: Callable, start: int, stop: int, sequence: bool, path: str) -> Callable[[Any], np.ndarray]:
    def read(msg: Any) -> np.ndarray:
        values = get(msg)
        if sequence and len(values) < stop:
            raise _short(path, len(values), stop)
        return np.asarray(values, dtype=np.float64)[start:stop]

    return read


def _elements_reader(
    get: Callable, inner: FieldPath, start: int, stop: int, sequence: bool, path: str
) -> Callable[[Any], np.ndarray]:
    def read(msg: Any) -> np.ndarray:
        elements = get(msg)
        if sequence and len(elements) < stop:
            raise _short(path, len(elements), stop)
        return np.concatenate([inner.read(e) for e in elements[start:stop]])

    return read


def _numbers_writer(
    name: str, typename: str, start: int, stop: int, sequence: bool
) -> Callable[[Any, np.ndarray], None]:
    dtype = _numpy_type(typename)

    def write(msg: Any, values: np.ndarray) -> None:
        current = getattr(msg, name)
        if sequence:
            # a sequence grows to the path's stop (elements before start keep their defaults, else 0)
            items = np.zeros(max(len(current), stop), dtype=dtype)
            items[: len(current)] = current
        else:
            items = np.array(current, dtype=dtype)
        items[start:stop] = _cast(values, typename)
        setattr(msg, name, _field_value(items, typename, sequence))

    return write


def _elements_writer(
    name: str, inner: FieldPath, start: int, stop: int, sequence: bool, make_element: Callable[[], Any]
) -> Callable[[Any, np.ndarray], None]:
    width = inner.width

    def write(msg: Any, values: np.ndarray) -> None:
        elements = list(getattr(msg, name))
        if sequence:
            elements += [make_element() for _ in range(stop - len(elements))]
        for i, element in enumerate(elements[start:stop]):
            inner.write(element, values[i * width : (i + 1) * width])
        if sequence:
            setattr(msg, name, elements)

    return write


_ARRAY_CODES = {"float": "f", "double": "d", "long double": "d", "int8": "b", "uint8": "B", "int16": "h"}
_ARRAY_CODES |= {"uint16": "H", "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q"}


def _numpy_type(typename: str) -> Any:
    if typename in FLOAT_TYPES:
        return np.float32 if typename == "float" else np.float64
    if typename == "boolean":
        return np.bool_
    return np.dtype(typename)


def _field_value(items: np.ndarray, typename: str, sequence: bool) -> Any:
    """``items`` as rosidl's setters take them: numpy for a fixed array, array.array for a numeric sequence."""
    if typename == "boolean":
        return [bool(v) for v in items]
    if sequence:
        return array.array(_ARRAY_CODES[typename], items.astype(_numpy_type(typename)).tobytes())
    return items


def _cast(values: np.ndarray, typename: str) -> np.ndarray:
    """Action values as a field of ``typename`` holds them: integers rounded and clipped to the type's range."""
    if typename in FLOAT_TYPES:
        return values
    if typename == "boolean":
        return values >= 0.5
    low, high = INT_RANGES[typename]
    return np.clip(np.rint(values), low, high)


def _scalar_setter(typename: str) -> Callable[[float], Any]:
    if typename in FLOAT_TYPES:
        return float
    if typename == "boolean":
        return lambda value: bool(value >= 0.5)
    low, high = INT_RANGES[typename]
    return lambda value: int(min(max(round(value), low), high))


# -- defaults of an actuator's (or a request's) other fields --------------------------------------


_Default = tuple[tuple[str, ...], str, Any]  # (the parent fields' names, the field, its value)


def message_factory(cls: type, defaults: Mapping[str, Any], key: str) -> Callable[[], Any]:
    """A function making a fresh ``cls`` message with ``defaults`` set (checked here: ConfigError naming the key).

    Setting the few given fields on a new message costs a fraction of copying a prepared one.
    """
    ops: list[_Default] = []
    apply_defaults(cls(), defaults, key, ops)

    def make() -> Any:
        msg = cls()
        for parents, name, value in ops:
            target = msg
            for parent in parents:
                target = getattr(target, parent)
            # a list or an array is copied: a message never shares a mutable field with the next one
            setattr(target, name, copy.copy(value) if isinstance(value, (list, array.array, np.ndarray)) else value)
        return msg

    return make


def apply_defaults(
    msg: Any, defaults: Mapping[str, Any], key: str, ops: list[_Default] | None = None, parents: tuple[str, ...] = ()
) -> None:
    """Set ``defaults`` (nested like the message, no indices) on ``msg``; ConfigError naming the bad key.

    A map under a sequence of messages is not set here: it is the default of every element a path
    creates (:func:`compile_path`). ``ops``, if given, receives each field set, to set it again later.
    """
    cls = type(msg)
    fields = fields_of(cls)
    for name, value in defaults.items():
        where = f"{key}.{name}"
        if name not in fields:
            raise ConfigError(
                where,
                value,
                f"{type_label(cls)} has no field '{name}'; its fields: {', '.join(cls.get_fields_and_field_types())}",
            )
        slot = fields[name]
        if isinstance(value, Mapping):
            if isinstance(slot, NamespacedType):
                apply_defaults(getattr(msg, name), value, where, ops, (*parents, name))
            elif isinstance(slot, AbstractNestedType) and isinstance(slot.value_type, NamespacedType):
                apply_defaults(_class_of(slot.value_type)(), value, where)  # checked; applied per element
            else:
                raise ConfigError(
                    where, value, f"'{name}' is a {cls.get_fields_and_field_types()[name]}, not a message"
                )
            continue
        converted = _default_value(slot, value, where, cls.get_fields_and_field_types()[name])
        setattr(msg, name, converted)
        if ops is not None:
            ops.append((parents, name, converted))


def _default_value(slot: Any, value: Any, key: str, shown: str) -> Any:
    """A params-file value as the field takes it, checked (rosidl's setters check only in some builds)."""
    if isinstance(slot, AbstractNestedType):
        if not isinstance(value, list):
            raise ConfigError(key, value, f"the field is a {shown}: give a list")
        if isinstance(slot, Array) and len(value) != slot.size:
            raise ConfigError(key, value, f"the field is a {shown}: give {slot.size} values")
        if isinstance(slot, BoundedSequence) and len(value) > slot.maximum_size:
            raise ConfigError(key, value, f"the field is a {shown}: give at most {slot.maximum_size} values")
        items = [_scalar_default(slot.value_type, v, key, shown) for v in value]
        element = slot.value_type
        if isinstance(element, BasicType) and element.typename in _ARRAY_CODES:
            return _field_value(
                np.array(items, dtype=_numpy_type(element.typename)),
                element.typename,
                isinstance(slot, AbstractSequence),
            )
        return items
    return _scalar_default(slot, value, key, shown)


def _scalar_default(slot: Any, value: Any, key: str, shown: str) -> Any:
    if isinstance(slot, BasicType) and slot.typename in NUMERIC_TYPES:
        if slot.typename == "boolean":
            if isinstance(value, bool):
                return value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if slot.typename in FLOAT_TYPES:
                return float(value)
            low, high = INT_RANGES[slot.typename]
            if isinstance(value, int) and low <= value <= high:
                return value
        raise ConfigError(key, value, f"the field is a {shown}: give a value of that type")
    if isinstance(slot, AbstractGenericString):
        if isinstance(value, str):
            return value
        raise ConfigError(key, value, f"the field is a {shown}: give a string")
    raise ConfigError(key, value, f"the field is a {shown}: give its fields as a map, or leave it out")


def string_reader(cls: type, path: str, key: str) -> Callable[[Any], str]:
    """A reader of the string field at dotted ``path`` in ``cls`` (a service response's message); ConfigError
    naming ``key`` if there is none."""
    target: Any = cls
    parts = path.split(".")
    for i, name in enumerate(parts):
        fields = fields_of(target)
        if name not in fields:
            raise ConfigError(
                key,
                path,
                f"{type_label(target)} has no field '{name}'; its fields: "
                f"{', '.join(target.get_fields_and_field_types())}",
            )
        slot = fields[name]
        if i < len(parts) - 1:
            if not isinstance(slot, NamespacedType):
                raise ConfigError(key, path, f"'{name}' is not a message; it has no field '{parts[i + 1]}'")
            target = _class_of(slot)
        elif not isinstance(slot, AbstractGenericString):
            raise ConfigError(key, path, f"'{name}' is a {target.get_fields_and_field_types()[name]}, not a string")
    get = operator.attrgetter(path)
    return lambda msg: str(get(msg))
