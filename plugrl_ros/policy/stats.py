"""What a robot's policy runner reports: request latency, idle steps, stale chunks, step rate."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PolicyStats:
    """One robot's counters, for diagnostics and the status line."""

    requests: int
    chunks: int  # answers applied (or kept for later ticks)
    stale_dropped: int  # answers that came too late for any of their steps
    rejected: int  # answers that broke the contract
    abandoned: int  # requests given up on after max_latency_s
    idle_steps: int  # ticks with no action left while the link was up and a chunk had run
    waiting_steps: int  # ticks with no action before the first chunk of a connection
    steps: int  # ticks with an action
    latency_median_s: float | None
    latency_p95_s: float | None
    step_rate_hz: float | None  # actions applied per second, over the last steps


class LatencyWindow:
    """The last ``size`` request latencies."""

    def __init__(self, size: int) -> None:
        self._values: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._values.append(seconds)

    def __len__(self) -> int:
        return len(self._values)

    def percentile(self, q: float) -> float | None:
        if not self._values:
            return None
        return float(np.percentile(np.fromiter(self._values, dtype=np.float64), q))


class RateWindow:
    """Events per second over the last ``size`` events."""

    def __init__(self, size: int = 100) -> None:
        self._times: deque[float] = deque(maxlen=size)

    def add(self, when: float) -> None:
        self._times.append(when)

    def clear(self) -> None:
        self._times.clear()

    def rate(self) -> float | None:
        if len(self._times) < 2 or self._times[-1] <= self._times[0]:
            return None
        return (len(self._times) - 1) / (self._times[-1] - self._times[0])
