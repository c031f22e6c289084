"""One env's watch for a silent robot: no fresh observation for too long, said loudly, and reset again.

In lockstep a robot publishes only in answer to a command or a reset. If its
answer is lost (published before the bridge's subscription matched, dropped
by DDS), robot and bridge wait for each other forever and the env silently
leaves training. Timer mode has the same trap with a robot that publishes
only after a reset, and plainer ones (a sensor driver died). So an env with
no fresh observation for its limit is reported at WARN, naming the topics it
waits for, and, if it has not moved since its last reset and a reset is
configured, reset again: the reset makes the robot publish anew. Resets for
silence back off (the reset's ``retry_initial_s`` doubling to
``retry_max_s``), so a robot that is really gone is not hammered.

Pure and clocked: :class:`RobotSide` feeds it what the env's sources say.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from plugrl_ros.protocol.backoff import Backoff

# After this many resets for silence in a row without a fresh observation, /diagnostics says ERROR.
REPEATED_RESETS = 3


class Verdict(enum.Enum):
    QUIET = "quiet"  # nothing to do
    WARN = "warn"  # the silence just passed its limit: say so, once
    RESET = "reset"  # reset the env again now
    HEARD = "heard"  # a silence that had been reported is over


@dataclass
class SilenceWatch:
    """Tracks one env's silence; :meth:`check` on every control tick (or lockstep housekeeping)."""

    backoff: Backoff  # delays between resets for silence
    can_reset: bool  # a reset procedure is configured (service or ready signal)
    since_s: float | None = None  # when the current silence began (None: not silent)
    reported: bool = False  # the current silence passed its limit and was reported
    troubled: bool = False  # a silence was reported since the env last had a fresh observation
    retry_at_s: float | None = None  # when to reset again
    resets: int = 0  # resets for silence since the last fresh observation
    total_resets: int = 0
    waiting_for: tuple[str, ...] = ()  # the silent topics, as the env's staleness names them

    def check(self, now_s: float, silent: list[str], limit_s: float, movable: bool) -> Verdict:
        """``silent``: what keeps the env from a fresh observation (empty: it has one); ``limit_s``: how long
        that may last (0: forever). ``movable``: the env took no step since its last reset and may be reset
        now (not paused, no reset running)."""
        if not silent:
            heard = self.troubled
            self.since_s = None
            self.reported = False
            self.troubled = False
            self.retry_at_s = None
            self.resets = 0
            self.backoff.reset()
            return Verdict.HEARD if heard else Verdict.QUIET
        self.waiting_for = tuple(silent)
        if self.since_s is None:
            self.since_s = now_s
        if limit_s <= 0 or now_s - self.since_s < limit_s:
            return Verdict.QUIET
        if not self.reported:
            self.reported = self.troubled = True
            if self.can_reset and movable:
                self.retry_at_s = now_s + self.backoff.next_delay()
            return Verdict.WARN
        if self.can_reset and movable:
            if self.retry_at_s is None:  # it became movable (resumed, or its reset finished) only now
                self.retry_at_s = now_s + self.backoff.next_delay()
            elif now_s >= self.retry_at_s:
                self.retry_at_s = None
                self.resets += 1
                self.total_resets += 1
                return Verdict.RESET
        return Verdict.QUIET

    def restart(self, now_s: float) -> None:
        """A reset for silence has completed: the robot gets a new ``limit_s`` to answer it."""
        self.since_s = now_s
        self.reported = False
        self.retry_at_s = None

    def silent_for(self, now_s: float) -> float:
        return 0.0 if self.since_s is None else now_s - self.since_s

    @property
    def repeated(self) -> bool:
        """Resetting has not brought the robot back, several times over."""
        return self.resets >= REPEATED_RESETS

    def problem(self, now_s: float) -> str:
        """The sentence for /diagnostics from the moment a silence passed its limit until the env is heard again."""
        if not self.troubled:
            return ""
        text = f"no fresh observation for {self.silent_for(now_s):.1f} s: waiting for {', '.join(self.waiting_for)}"
        if self.resets:
            text += f"; reset {self.resets}x for it"
        if not self.can_reset:
            text += "; no reset is configured to make the robot publish again"
        return text
