"""How a Gymnasium env's spaces become topics and arrays: observation keys, the action vector, their conversions.

Observations. A ``Box`` observation is one state, ``observation``; a ``Dict``
of Boxes is one state per key (its own topic). A ``Discrete`` observation (or
Dict entry) is one value. Every state travels flattened (C order) as float64:
a float64 env's values bit for bit, any other dtype widened to float64, which
is exact for float32 and for integers up to 2**53. Anything else (nested
Dicts, Tuples, text, graphs) is refused with the reason.

Actions. A ``Box`` action is a vector of ``prod(shape)`` values; the bridge's
``min``/``max`` clip them to the space's bounds, and the robot casts them to
the space's dtype (float64 → float32 rounds to the nearest float32: the
documented conversion; an integer Box's values are rounded to the nearest
integer and held inside its bounds). A ``Discrete(n, start)`` action is one value, rounded
to the nearest integer and held inside ``[start, start + n - 1]``: the mapping
a continuous policy needs to drive a discrete env. Rounding is numpy's ``rint``:
an exact half goes to the even neighbour (0.5 → 0, 1.5 → 2, -0.5 → 0), the
IEEE 754 default, unbiased over many actions; a policy's continuous output
meets an exact half with probability zero, so this only fixes what a
hand-written action gets. Any other action space is
refused. A vector of the wrong width, or with a NaN or infinite value, is
never turned into an env action.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

# The state name (and topic) of a Box observation, and the actuator name (and topic) of the action.
OBSERVATION = "observation"
ACTION = "action"
# A Dict key becomes a parameter name and a topic name: both allow only this.
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
# The bridge's clip limits are finite numbers: an unbounded side of a Box is clipped at the largest float.
_LARGEST = float(np.finfo(np.float64).max)


def namespace(copy: int) -> str:
    """The namespace of copy ``copy``: its topics and reset service live under it."""
    return f"gym{copy}"


class UnsupportedSpace(ValueError):
    """A space this package cannot carry over ROS topics; the message says which and why."""


@dataclass(frozen=True)
class ObservationKey:
    """One state of the observation: its name (the trainer's ``states.<name>``), topic and size."""

    name: str
    topic: str  # relative: under each copy's namespace
    size: int  # values per message (the flattened shape)
    dict_key: str | None  # the Dict entry it reads, None for the whole observation

    def values(self, observation: Any) -> np.ndarray:
        """This key's part of ``observation`` as a flat float64 array (a copy: the env moves on)."""
        part = observation if self.dict_key is None else observation[self.dict_key]
        return np.array(part, dtype=np.float64).reshape(self.size)


def observation_keys(space: spaces.Space) -> tuple[ObservationKey, ...]:
    """The states an observation of ``space`` is published and sent as."""
    if isinstance(space, spaces.Dict):
        keys = []
        for key, sub in space.spaces.items():
            if not isinstance(key, str) or not _NAME.match(key):
                raise UnsupportedSpace(
                    f"observation Dict key {key!r}: a key becomes a topic and a parameter name, "
                    "so it must start with a letter and hold only letters, digits and _"
                )
            keys.append(ObservationKey(key, f"{OBSERVATION}/{key}", _flat_size(sub, f"observation[{key!r}]"), key))
        if not keys:
            raise UnsupportedSpace("the observation is an empty Dict: there is nothing to observe")
        return tuple(keys)
    return (ObservationKey(OBSERVATION, OBSERVATION, _flat_size(space, "the observation"), None),)


def _flat_size(space: spaces.Space, what: str) -> int:
    if isinstance(space, spaces.Box):
        if space.dtype.kind not in "fiub":
            raise UnsupportedSpace(f"{what} is a Box of {space.dtype}: only numbers can travel as float64")
        return int(np.prod(space.shape, dtype=np.int64))
    if isinstance(space, spaces.Discrete):
        return 1
    raise UnsupportedSpace(
        f"{what} is a {type(space).__name__} space; a robot publishes Box and Discrete observations "
        "(or a Dict of them, one topic per key)"
    )


@dataclass(frozen=True)
class ActionLayout:
    """The action vector of an env: its width, its bounds (the bridge's clip limits) and the env action it makes."""

    space: spaces.Space
    width: int
    low: tuple[float, ...]
    high: tuple[float, ...]

    @property
    def discrete(self) -> bool:
        return isinstance(self.space, spaces.Discrete)

    def problem(self, values: np.ndarray) -> str | None:
        """Why ``values`` (float64, 1-D) cannot become an env action, or None."""
        if values.shape != (self.width,):
            return f"expected {self.width} value(s), got {values.size}"
        if not np.isfinite(values).all():
            return "it holds NaN or infinite values"
        return None

    def to_env(self, values: np.ndarray) -> Any:
        """The env action for checked ``values`` (see :meth:`problem`)."""
        assert self.problem(values) is None, self.problem(values)
        space = self.space
        if isinstance(space, spaces.Discrete):
            start, n = int(space.start), int(space.n)
            return np.int64(start + min(max(int(np.rint(values[0])) - start, 0), n - 1))
        assert isinstance(space, spaces.Box)
        shaped = values.reshape(space.shape)
        if space.dtype.kind in "iub":
            # rounded and held inside the space, as a Discrete action is: a cast alone would wrap a value
            # beyond the dtype's range (300 -> 44 in int8) or give a value outside the bounds
            shaped = np.clip(np.rint(shaped), space.low, space.high)
        return shaped.astype(space.dtype)

    def clip(self, values: np.ndarray) -> np.ndarray:
        """``values`` clipped to the bounds, as the generated bridge config clips them (float64)."""
        return np.clip(np.asarray(values, dtype=np.float64), self.low, self.high)


def action_layout(space: spaces.Space) -> ActionLayout:
    """The action vector of ``space``; :class:`UnsupportedSpace` if none fits it."""
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return ActionLayout(space, 1, (float(start),), (float(start + int(space.n) - 1),))
    if isinstance(space, spaces.Box):
        if space.dtype.kind not in "fiub":
            raise UnsupportedSpace(f"the action is a Box of {space.dtype}: the trainer sends numbers")
        width = int(np.prod(space.shape, dtype=np.int64))
        if width < 1:
            raise UnsupportedSpace(f"the action Box has shape {space.shape}: no value to send")
        low = tuple(_bound(v) for v in np.asarray(space.low, dtype=np.float64).reshape(width))
        high = tuple(_bound(v) for v in np.asarray(space.high, dtype=np.float64).reshape(width))
        return ActionLayout(space, width, low, high)
    raise UnsupportedSpace(
        f"the action is a {type(space).__name__} space; a robot takes a Box action, or a Discrete one "
        "(one value, rounded to the nearest allowed integer, halves to even)"
    )


def _bound(value: float) -> float:
    return float(value) if math.isfinite(value) else math.copysign(_LARGEST, value)
