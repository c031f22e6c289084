"""Diagnostic entries under construction, and what the robot side says of one env, whatever the mode.

Every mode reports its link and stepping in its own words, but the reasons a
robot cannot move (resetting, a reset that fails, a silent or stale sensor,
an actuator nobody listens to, an observation that does not convert, a pause)
are the robot side's, and are worded once, here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagnostic_msgs.msg import DiagnosticStatus

from plugrl_ros.robot.env_io import EnvIO

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


def percentile_ms(values: list[float], q: float) -> str:
    """The q-quantile of ``values`` (seconds) in milliseconds, or '-' if there are none."""
    if not values:
        return "-"
    ordered = sorted(values)
    index = min(len(ordered) - 1, round(q * (len(ordered) - 1)))
    return f"{ordered[index] * 1000:.1f}"


def env_condition(io: EnvIO, paused: bool, now_ns: int, now_s: float) -> tuple[bytes, str] | None:
    """What keeps env ``io`` from stepping, as (level, sentence); None when the robot side has nothing to say.

    ``now_s``: the monotonic clock, which the reset and silence watches run on.
    """
    if io.resetting:
        if io.reset.failures:
            return WARN, f"reset failing ({io.reset.failures}x): {io.reset.last_error}"
        if io.reset.awaiting_publishers:
            return OK, f"waiting for the robot's publishers on {', '.join(io.reset.awaiting_publishers)} to reset it"
        return OK, "resetting again for silence" if io.recovering else f"resetting ({io.reset.state.value})"
    if silent := io.silence.problem(now_s):
        return (ERROR if io.silence.repeated or not io.silence.can_reset else WARN), silent
    stale = io.stale_sources(now_ns)
    if stale:
        if all(reason.endswith("(nothing new since the reset)") for reason in stale):
            return OK, "waiting for fresh observations after the reset"
        return WARN, "stale: " + "; ".join(stale)
    if unheard := io.unheard_problem():
        return WARN, unheard
    if io.conversion_problem:
        return WARN, io.conversion_problem
    if paused:
        return OK, "paused"
    return None


def share(part: int, whole: int) -> str:
    """``part`` of ``whole`` as a percentage for /diagnostics and the status line ('-' before anything counted)."""
    return "-" if whole <= 0 else f"{100.0 * part / whole:.0f}%"


def person_values(control: str, person_steps: int, steps: int) -> dict[str, str]:
    """One env's intervention figures with a person in the loop: who commands now, and the person's share."""
    return {
        "commanded by": control,
        "person steps": str(person_steps),
        "intervention share": share(person_steps, steps),
    }
