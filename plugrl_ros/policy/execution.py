"""How a new action chunk takes over from the one running: the settings and the blending rules.

Rows of a chunk are indexed by tick: a chunk computed from the observation
captured at tick ``t`` holds in row ``k`` the action meant for tick ``t + k``.
Every mode but ``sync`` applies a chunk from row ``now - t`` on, never from
row 0, so a late answer never replays steps whose moment has passed.

- ``switch``: the newest chunk replaces the running one at once. Cheapest;
  a jump at the boundary if the two chunks disagree.
- ``ensemble``: temporal ensembling as in ACT (Zhao et al., 2023): the action
  at a tick is the weighted average of every live chunk's prediction for that
  tick, with weights ``w_i = exp(-rate * i)`` where ``i = 0`` is the *oldest*
  prediction. A positive rate favours older predictions (smoother, slower to
  react); 0 is a plain mean; a negative rate favours the newest. Smooth, but
  it lags behind the newest observation, and it only averages where chunks
  overlap: request earlier (``request_ahead_steps``) for more overlap.
- ``crossfade``: over ``crossfade_steps`` ticks, the action moves linearly
  from the old chunk's prediction to the new one's: at the ``j``-th tick of
  the new chunk (``j = 0, 1, ...``) it is ``(1 - a) * old + a * new`` with
  ``a = (j + 1) / crossfade_steps``, so the last tick of the fade is the new
  chunk's own action. Where the old chunk has no prediction left, the new
  one applies. A chunk arriving mid-fade starts a new fade from the chunk
  that was fading in.
- ``sync``: request, wait (idle) for the answer, run the whole chunk from
  row 0, then request again. No alignment, no overlap: the robot idles for
  the request's latency at every chunk. For comparison, and for servers
  whose chunks are meant to run whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MODES = ("sync", "switch", "ensemble", "crossfade")
# why chunks of one step run only in sync (a config error at startup; a warning when a server announces H = 1)
ONE_STEP_CHUNKS = (
    "a chunk of one step has run before the answer to the request made during it can come, so in every mode but "
    "sync each answer would be dropped as late and the robot would stand still; use policy.execution.mode: sync"
)


@dataclass(frozen=True)
class ExecutionSettings:
    """How one robot runs a policy server's chunks (see the module's docstring for the modes)."""

    mode: str = "switch"
    # request the next chunk when this many steps (or fewer) are left of the newest;
    # None: from the measured latency (its 95th percentile, in ticks, plus one)
    request_ahead_steps: int | None = None
    ensemble_rate: float = 0.01  # ACT's default m
    crossfade_steps: int = 5
    initial_latency_s: float = 0.1  # assumed before the first answer is measured
    max_latency_s: float = 5.0  # a request unanswered this long is abandoned (the link should reconnect)
    # the first answer on a connection may be slow for good reasons (a model compiling): its own bound
    first_answer_s: float = 300.0
    latency_window: int = 100  # answers the latency statistics (and the automatic threshold) look back on

    def __post_init__(self) -> None:
        assert self.mode in MODES, self.mode
        assert self.request_ahead_steps is None or self.request_ahead_steps >= 0
        assert np.isfinite(self.ensemble_rate)
        assert self.crossfade_steps >= 1
        assert 0 <= self.initial_latency_s <= self.max_latency_s and self.max_latency_s > 0
        assert self.first_answer_s > 0
        assert self.latency_window >= 1


def ensemble_weights(count: int, rate: float) -> np.ndarray:
    """ACT's weights for ``count`` predictions, oldest first: ``exp(-rate * i)``, normalised to sum 1."""
    weights = np.exp(-rate * np.arange(count, dtype=np.float64))
    return weights / weights.sum()


def ensemble(predictions: Sequence[np.ndarray], rate: float) -> np.ndarray:
    """The weighted average of ``predictions`` (oldest first) for one tick."""
    weights = ensemble_weights(len(predictions), rate)
    return np.tensordot(weights, np.stack(predictions), axes=1)


def crossfade(old: np.ndarray, new: np.ndarray, j: int, steps: int) -> np.ndarray:
    """The action at the ``j``-th tick (from 0) of a fade over ``steps`` ticks from ``old`` to ``new``."""
    alpha = min(1.0, (j + 1) / steps)
    return (1.0 - alpha) * old + alpha * new
