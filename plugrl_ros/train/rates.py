"""Events per second over a recent window: the control loop's tick rate, each env's step rate."""

from __future__ import annotations

from collections import deque


class RateMeter:
    """Events per second over the last ``window_s`` seconds: the loop's tick rate, or an env's step rate."""

    def __init__(self, window_s: float = 5.0, capacity: int = 4000) -> None:
        self._window_s = window_s
        self._times: deque[float] = deque(maxlen=capacity)

    def add(self, now: float) -> None:
        self._times.append(now)

    def rate(self, now: float) -> float:
        """Events per second over the window ending at ``now`` (a silence lowers it); 0.0 before two events."""
        times = self._times
        while times and times[0] < now - self._window_s:
            times.popleft()
        span = now - times[0] if times else 0.0
        if len(times) < 2 or span <= 0:
            return 0.0
        return (len(times) - 1) / span
