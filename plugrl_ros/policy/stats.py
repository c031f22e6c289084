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
    abandoned: int  # requests given up on after their answer bound (latency.first_answer_s, then max_s)
    idle_steps: int  # ticks with no action left while the link was up and a chunk had run
    waiting_steps: int  # ticks with no action before the first chunk of a connection
    steps: int  # ticks with an action
    latency_median_s: float | None
    latency_p95_s: float | None
    step_rate_hz: float | None  # actions applied per second, over the last steps

    def values(self) -> dict[str, str]:
        """The counters as text, for a diagnostics entry's key/value pairs."""
        return {
            "request latency median ms": _ms(self.latency_median_s),
            "request latency p95 ms": _ms(self.latency_p95_s),
            "idle steps at boundaries": str(self.idle_steps),
            "chunks dropped as stale": str(self.stale_dropped),
            "answers rejected": str(self.rejected),
            "requests abandoned": str(self.abandoned),
            "step rate Hz": "-" if self.step_rate_hz is None else f"{self.step_rate_hz:.1f}",
            "requests": str(self.requests),
            "chunks": str(self.chunks),
            "steps": str(self.steps),
            "steps waiting for a first chunk": str(self.waiting_steps),
        }

    def summary(self) -> str:
        """One line for the status log."""
        rate = "-" if self.step_rate_hz is None else f"{self.step_rate_hz:.0f}"
        return (
            f"{rate} steps/s, latency {_ms(self.latency_median_s)}/{_ms(self.latency_p95_s)} ms (median/p95), "
            f"{self.idle_steps} idle at boundaries, {self.stale_dropped} stale, {self.rejected} rejected"
        )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


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
