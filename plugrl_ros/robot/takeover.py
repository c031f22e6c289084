"""Who commands one env: the policy, a person (human in the loop), or nobody (a person's device went silent).

Pure logic with an injected clock; the robot side feeds it what the person's
device says and asks it on every control tick. Three rules say that the person
has taken over:

- ``button`` and ``topic``: a deadman (a Joy button held, or a ``std_msgs/Bool``
  saying true). While it is held the person commands, as long as both the
  deadman and the person's command keep arriving within ``max_age_s``. A device
  that goes silent while its deadman was last seen held gives the robot to
  nobody (:attr:`Control.SILENT`: the actuators idle), never back to the policy:
  the person may still be holding it, and the robot must not start moving on
  its own under their hand.
- ``fresh``: a command fresher than ``max_age_s`` is the takeover (a leader arm
  or a teleop node that publishes only while the person moves it); when it
  stops, the policy may command again.

What happens after the person lets go (idle until a chunk computed for the
current observation arrives) is the stepping rule's, not this rule's.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable

from plugrl_ros.params.declarations import TAKEOVER_RULES


class Control(enum.Enum):
    POLICY = "policy"  # the person is not holding: the policy's chunk may run
    PERSON = "person"  # the person holds and their command is fresh: it goes out instead of the policy's
    SILENT = "silent"  # the person's deadman was last seen held but their device went silent: idle


class Takeover:
    """One env's takeover rule; :meth:`control` on every tick."""

    def __init__(self, rule: str, max_age_s: float, clock: Callable[[], float]) -> None:
        if rule not in TAKEOVER_RULES:
            raise ValueError(f"takeover rule {rule!r}; allowed: {', '.join(TAKEOVER_RULES)}")
        if max_age_s <= 0:
            raise ValueError("a takeover rule needs max_age_s > 0")
        self.rule = rule
        self.max_age_s = max_age_s
        self._clock = clock
        self._command_s = -math.inf  # when the person's last command arrived
        self._hold_s = -math.inf  # when the deadman last spoke
        self._held = False  # what it last said

    def commanded(self) -> None:
        """The person's device sent a command (whole: every actuator's part of it is known)."""
        self._command_s = self._clock()

    def deadman(self, held: bool) -> None:
        """The deadman spoke (a Joy message's button; the Bool topic). Ignored by the ``fresh`` rule."""
        self._held = held
        self._hold_s = self._clock()

    def control(self) -> Control:
        """Who commands the robot now."""
        now = self._clock()
        command_fresh = now - self._command_s <= self.max_age_s
        if self.rule == "fresh":
            return Control.PERSON if command_fresh else Control.POLICY
        if not self._held:
            return Control.POLICY
        if command_fresh and now - self._hold_s <= self.max_age_s:
            return Control.PERSON
        return Control.SILENT
