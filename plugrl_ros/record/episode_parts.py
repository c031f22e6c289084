"""What the three episode assemblers share (train, deploy and teleop recordings): the arrays of one
episode, the parts of a recorded observation, and the recorder's dropped calls."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from plugrl_ros.record.read import Recorded, array, image

Episode = TypeVar("Episode")


class CallGaps:
    """Tells when recorder calls were dropped: a gap in the sequence numbers (whose calls, nobody can tell)."""

    def __init__(self) -> None:
        self._last = 0

    def gap(self, sequence: int) -> bool:
        """Whether calls were dropped just before the one numbered ``sequence`` (fed in file order)."""
        dropped = bool(self._last) and sequence > self._last + 1
        self._last = max(self._last, sequence)
        return dropped


@dataclass(frozen=True)
class EpisodeArrays:
    env: int
    index: int
    arrays: dict[str, np.ndarray]


def episode_or_reason(
    arrays_of: Callable[[int, Episode], dict[str, np.ndarray]],
    env: int,
    episode: Episode,
    number: int,
    skipped: list[str],
    what: str = "episode",
) -> Iterator[EpisodeArrays]:
    """Episode ``number`` of ``env`` with the arrays ``arrays_of`` makes of it; or, if it cannot (ValueError), why
    not, in ``skipped``. The three assemblers close an episode this way, and each then counts it exported."""
    try:
        arrays = arrays_of(env, episode)
    except ValueError as exc:
        skipped.append(f"env {env} {what} {number}: {exc}")
        return
    yield EpisodeArrays(env, number, arrays)


def observation_part(name: str, recorded: Recorded) -> tuple[str, Any]:
    """One part of a recorded observation (``images/<n>``, ``states/<n>`` or ``text``), by its topic's tail."""
    kind, _, obs_name = name.partition("/")
    if kind == "images":
        return f"images/{obs_name}", image(recorded)
    if kind == "states":
        return f"states/{obs_name}", array(recorded.msg)
    return "text", recorded.msg.data


def stack_observations(rows: list[dict[str, Any]], prefix: str, out: dict[str, np.ndarray]) -> None:
    """``out[prefix/<name>]``: each part of ``rows`` stacked (every row must have the same parts)."""
    names = set(rows[0]) if rows else set()
    if any(set(r) != names for r in rows):
        raise ValueError("its observations do not all have the same names")
    for name in sorted(names):
        out[f"{prefix}/{name}"] = np.stack([np.asarray(r[name]) for r in rows])
