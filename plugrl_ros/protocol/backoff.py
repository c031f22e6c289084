"""Retry delays that double up to a bound: the trainer and policy reconnects, a robot's reset service."""

from __future__ import annotations

import random


class Backoff:
    """Exponential retry delays (``initial_s``, doubling, at most ``max_s``); reset after a success.

    With ``jitter`` (reconnects) a delay is drawn from [base/2, base]; without
    (a robot's reset service, one caller per robot) it is exactly the base.
    """

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None, jitter: bool = True) -> None:
        self._initial = initial_s
        self._max = max_s
        self._rng = rng or random.Random()
        self._jitter = jitter
        self._failures = 0

    def next_delay(self) -> float:
        base = min(self._max, self._initial * (2 ** min(self._failures, 30)))
        self._failures += 1
        if not self._jitter:
            return base
        # "equal jitter": never below half the base, so a fleet of robots
        # restarting together spreads out without hammering the trainer.
        return base / 2 + self._rng.uniform(0, base / 2)

    def reset(self) -> None:
        self._failures = 0
