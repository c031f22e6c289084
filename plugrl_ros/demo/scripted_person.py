"""A scripted stand-in for a person at a gamepad on the demo reacher: when to hold the deadman, and the stick.

Pure logic with an injected clock. The person watches the fingertip's distance
to the target: once the arm has stayed farther than ``stray_m`` for
``patience_s`` (the policy had its chance), they hold the deadman and steer
the joints toward the target with a proportional controller, and let go once
the fingertip is within ``release_m``. They help only for the first
``helping_s`` of the run (0: always), as a person does at the start of training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PersonSettings:
    stray_m: float = 0.15  # farther than this from the target, for patience_s: the arm strays
    patience_s: float = 1.0
    release_m: float = 0.03  # let go once the fingertip is this close
    gain: float = 3.0  # joint velocity (rad/s) per radian of joint offset to the target
    max_speed: float = 2.0  # the stick's full deflection: the bridge's intervention.joy.scale
    helping_s: float = 180.0  # help during the run's first this many seconds (0: always)


class ScriptedPerson:
    """One reacher's person; :meth:`see` on each target message, then :attr:`held` and :meth:`stick`."""

    def __init__(self, settings: PersonSettings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self._clock = clock
        self._start_s = clock()
        self._far_since: float | None = None
        self.held = False
        self.takeovers = 0
        self._offsets = np.zeros(2)

    def see(self, target: np.ndarray) -> None:
        """The reacher's ``target`` message: [dx, dy] to the target (m), then the joint offsets that reach it."""
        s = self.settings
        now = self._clock()
        distance = float(np.hypot(target[0], target[1]))
        self._offsets = np.asarray(target[2:4], dtype=np.float64)
        helping = s.helping_s <= 0 or now - self._start_s < s.helping_s
        if distance <= s.stray_m:
            self._far_since = None
        elif self._far_since is None:
            self._far_since = now
        if self.held:
            self.held = helping and distance > s.release_m
        elif helping and self._far_since is not None and now - self._far_since >= s.patience_s:
            self.held = True
            self.takeovers += 1

    def stick(self) -> list[float]:
        """The two axes in [-1, 1]: joint velocities toward the target over the stick's full deflection."""
        s = self.settings
        return np.clip(s.gain * self._offsets / s.max_speed, -1.0, 1.0).tolist()
