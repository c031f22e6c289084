"""A dead-man switch on the pause topic: the robots run only while it keeps saying "run".

Pure logic with an injected clock; the bridge feeds it the topic's messages
(``False`` = run, ``True`` = pause) and asks it on every tick. Silence for
longer than ``max_age_s`` stops the robots, and so does ``True``. Resuming
takes two "run" messages at least ``resume_gap_s`` apart (and at most
``max_age_s``): messages that queued up while the bridge or the link stalled
are delivered all at once and are old, so one of them, or a burst, must not
move a robot. The robots are stopped until the switch first says run.
"""

from __future__ import annotations

import math
from collections.abc import Callable

RESUME_GAP_S = 0.02  # closer together than any switch publishes: a backlog delivered at once


class DeadManSwitch:
    """Whether the robots may run; :attr:`stopping` is True while the switch keeps them stopped."""

    def __init__(self, max_age_s: float, clock: Callable[[], float], resume_gap_s: float = RESUME_GAP_S) -> None:
        if max_age_s <= 0:
            raise ValueError("a dead-man switch needs max_age_s > 0")
        self.max_age_s = max_age_s
        self._clock = clock
        self._resume_gap_s = min(resume_gap_s, max_age_s / 2)
        self.stopping = True
        self._run_heard_s = -math.inf  # the last "run" while the robots ran
        self._resume_heard_s: float | None = None  # the first "run" since the switch stopped them

    def expired(self) -> str | None:
        """Stop the robots if the switch has been silent too long; says why when this call did it."""
        if self.stopping or self._clock() - self._run_heard_s <= self.max_age_s:
            return None
        self.stopping = True
        self._resume_heard_s = None
        return "went silent"

    def heard(self, pause: bool) -> str | None:
        """The switch spoke; says what changed when this message (or the silence before it) stopped
        the robots or let them run again."""
        silent = self.expired()  # a message handled after the deadline does not extend it
        now = self._clock()
        if pause:
            self._resume_heard_s = None
            if self.stopping:
                return silent
            self.stopping = True
            return "said pause"
        if not self.stopping:
            self._run_heard_s = now
            return None
        first = self._resume_heard_s
        if first is None or not self._resume_gap_s <= now - first <= self.max_age_s:
            self._resume_heard_s = now  # the first of two
            return silent
        self._run_heard_s, self._resume_heard_s = now, None
        self.stopping = False
        return "said run again"
