"""A PlugRL observation batch, read row by row into the RLModule's observation space.

The runner's observation space is ``{"states": {name: Box}, "images": {name:
Box}}`` (:mod:`plugrl_ros.serve.spaces`). A batch from a bridge must carry
every name the space declares, with each row of the declared shape: states
are numbers (cast to the space's float32; NaN and infinity refused, they
would poison the learner), images ``uint8`` of exactly the declared size.
Names the space does not declare are ignored, as PlugRL's server hands the
policy an observation unread: a bridge may send a camera the policy does not
use. Anything else is a :class:`SpaceMismatch`, which closes that bridge's
connection for a resync with a sentence saying which key is wrong and how;
the runner and its other bridges go on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_ros.protocol.errors import ProtocolError

GROUPS = ("states", "images")


class SpaceMismatch(ProtocolError):
    """A bridge's observation does not fit the runner's observation space."""


def split_rows(
    columns: dict[tuple[str, str], np.ndarray], groups: Iterable[str], n: int
) -> list[dict[str, dict[str, np.ndarray]]]:
    """Columns ``(group, name) -> [n, ...]`` as n observations ``{group: {name: row}}``."""
    out = []
    for row in range(n):
        item: dict[str, dict[str, np.ndarray]] = {group: {} for group in groups}
        for (group, name), column in columns.items():
            # a row of its own: a view would keep the whole received frame alive in every episode that
            # stores it, and be read-only (the frame's buffer) for connectors that write in place
            item[group][name] = column[row].copy()
        out.append(item)
    return out


class ObservationReader:
    """Reads observation batches into per-row observations of one space."""

    def __init__(self, space: gym.spaces.Space) -> None:
        if not isinstance(space, gym.spaces.Dict) or not set(space.spaces) <= set(GROUPS) or not space.spaces:
            raise ValueError(
                "the observation space must be a Dict of 'states' and/or 'images' Dicts of Boxes, "
                f"as robot_spaces() builds it; got {space}"
            )
        self.space = space
        self._boxes: list[tuple[str, str, gym.spaces.Box]] = []
        for group, inner in space.spaces.items():
            if not isinstance(inner, gym.spaces.Dict):
                raise ValueError(f"observation space [{group!r}] must be a Dict of Boxes, got {inner}")
            for name, box in inner.spaces.items():
                if not isinstance(box, gym.spaces.Box):
                    raise ValueError(f"observation space [{group!r}][{name!r}] must be a Box, got {box}")
                self._boxes.append((group, name, box))

    def rows(self, observation: Any, n: int, where: str) -> list[dict[str, dict[str, np.ndarray]]]:
        """The n rows of ``observation`` as the space's observations; SpaceMismatch naming the key otherwise."""
        if not isinstance(observation, dict):
            raise SpaceMismatch(where, "is not a map of images, states and text")
        if n == 0:
            # every row reused: nothing to read, whatever names the empty batch lists (PlugRL's checker sends {})
            return []
        columns: dict[tuple[str, str], np.ndarray] = {}
        for group, name, box in self._boxes:
            columns[group, name] = self._column(observation, group, name, box, n, f"{where}.{group}.{name}")
        return split_rows(columns, self.space.spaces, n)

    @staticmethod
    def _column(observation: dict, group: str, name: str, box: gym.spaces.Box, n: int, key: str) -> np.ndarray:
        arrays = observation.get(group)
        if not isinstance(arrays, dict) or name not in arrays:
            present = sorted(arrays) if isinstance(arrays, dict) else []
            raise SpaceMismatch(
                key, f"is missing: the runner's observation space needs it (this bridge sends {group} {present})"
            )
        array = arrays[name]
        if not isinstance(array, np.ndarray) or array.shape != (n, *box.shape):
            shape = list(array.shape) if isinstance(array, np.ndarray) else type(array).__name__
            raise SpaceMismatch(
                key,
                f"has shape {shape}, the runner's space declares {list(box.shape)} per row ({n} rows): "
                "the bridge's params file and the trainer's spaces describe different robots",
            )
        if group == "images":
            if array.dtype != np.uint8:
                raise SpaceMismatch(key, f"is {array.dtype.str}; images are |u1 (uint8)")
            return array
        if array.dtype.kind not in "fiu":
            raise SpaceMismatch(key, f"is {array.dtype.str}; states are numbers")
        column = array.astype(box.dtype)
        if not np.isfinite(column).all():
            raise SpaceMismatch(key, "holds NaN or infinite values")
        return column
