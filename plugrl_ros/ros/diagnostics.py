"""The bridge's status as diagnostic_msgs: trainer link, control loop, and one entry per env."""

from __future__ import annotations

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
