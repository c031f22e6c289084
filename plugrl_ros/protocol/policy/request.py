"""The request map a policy server reads: which of the robot's observations goes under which key.

openpi policies name their inputs freely: DROID and LIBERO examples read
flat keys like ``observation/image`` and ``observation/state``, ALOHA reads
nested maps like ``{"images": {"cam_high": ...}, "state": ...}``, and most
read a ``prompt`` string. A :class:`RequestLayout` holds that naming as
configured: each input is a key path and the source it comes from, and a
separator either joins the path into one flat key (``"/"``) or leaves it as
nested maps (``""``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestInput:
    """One entry of the request: ``path`` (a key, or the keys of nested maps) and the source it holds."""

    path: tuple[str, ...]
    source: str  # "images.<name>", "states.<name>" or "text"


@dataclass(frozen=True)
class RequestLayout:
    inputs: tuple[RequestInput, ...]
    separator: str = "/"  # "": nested maps

    def keys(self) -> list[str]:
        """The request's top-level keys (for logs and errors)."""
        return sorted({self._top(i.path) for i in self.inputs})

    def _top(self, path: tuple[str, ...]) -> str:
        return self.separator.join(path) if self.separator else path[0]

    def build(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The request for one observation; ``values`` maps every source named here to its value."""
        request: dict[str, Any] = {}
        for item in self.inputs:
            value = values[item.source]
            if self.separator:
                request[self.separator.join(item.path)] = value
                continue
            node = request
            for part in item.path[:-1]:
                node = node.setdefault(part, {})
            node[item.path[-1]] = value
        return request
