"""The bridge's status as diagnostic_msgs: trainer link, control loop, and one entry per env."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

OK = DiagnosticStatus.OK
WARN = DiagnosticStatus.WARN
ERROR = DiagnosticStatus.ERROR


@dataclass
class Entry:
    """One diagnostic status under construction."""

    name: str
    level: bytes = OK
    message: str = "ok"
    values: dict[str, str] = field(default_factory=dict)

    def worse(self, level: bytes, message: str) -> None:
        """Raise the level (never lower it) and say why."""
        if ord(level) > ord(self.level):
            self.level = level
            self.message = message


def status_array(entries: list[Entry], hardware_id: str, stamp: object) -> DiagnosticArray:
    array = DiagnosticArray()
    array.header.stamp = stamp
    for entry in entries:
        status = DiagnosticStatus(level=entry.level, name=entry.name, message=entry.message, hardware_id=hardware_id)
        status.values = [KeyValue(key=k, value=str(v)) for k, v in entry.values.items()]
        array.status.append(status)
    return array


def percentile_ms(values: list[float], q: float) -> str:
    """The q-quantile of ``values`` (seconds) in milliseconds, or '-' if there are none."""
    if not values:
        return "-"
    ordered = sorted(values)
    index = min(len(ordered) - 1, round(q * (len(ordered) - 1)))
    return f"{ordered[index] * 1000:.1f}"


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
