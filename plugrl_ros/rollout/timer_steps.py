"""Timer mode's stepping rule: when a step goes out, when its result is sampled, when an env idles.

A timer ticks every period. At a tick each env's step in flight is sampled
(its observation is the one after the step), and the next step of a running
chunk goes out at once, so those steps last one period. A new chunk cannot
start at a tick: its action arrives after the tick that sent the infer.
Waiting for the next tick to publish it would make every chunk one period
longer than its steps, and a one-step chunk two periods long, half of them
idle. So a new chunk's first step goes out the moment its action arrives, and
between the infer and that moment the env keeps its last command rather than
idling for a few milliseconds (for a velocity controller, a zero pulse on
every chunk); if the answer has not come by the next tick, the env idles.

The first step's result is sampled at the first tick at least a quarter of
a period after it went out. A trainer answering within three quarters of a
period keeps one step per tick (sample to sample, the robot moved for one
period: the last command until the new one came, then the new one). A later
answer makes that step span two ticks rather than be sampled a sliver of a
period after its action went out, when its observation would show almost
nothing of it.

Pure and clocked by its caller: the bridge passes its node clock's time, the
tests a simulated one.
"""

from __future__ import annotations

# How long a chunk's first step must have acted before it is sampled, as a fraction of the period.
MIN_STEP_FRACTION = 0.25


class TimerSteps:
    """When each env's step started and whether it may be sampled; which envs wait for an answer this tick."""

    def __init__(self, n_envs: int, period_s: float) -> None:
        assert n_envs >= 1 and period_s > 0
        self.period_s = period_s
        self._started_at: list[float | None] = [None] * n_envs
        self._tick = 0
        self._asked_at_tick: list[int | None] = [None] * n_envs

    def tick(self) -> None:
        """A tick begins: answers asked for at earlier ticks are late from now on."""
        self._tick += 1

    def started(self, env: int, now: float) -> None:
        """``env``'s step went out at ``now``."""
        self._started_at[env] = now

    def due(self, env: int, now: float) -> bool:
        """``env``'s step in flight has lasted long enough to be sampled at this tick."""
        started = self._started_at[env]
        return started is None or now - started >= MIN_STEP_FRACTION * self.period_s - 1e-9

    def asked(self, env: int) -> None:
        """``env`` went into an infer at this tick: its answer is due before the next."""
        self._asked_at_tick[env] = self._tick

    def awaiting_answer(self, env: int) -> bool:
        """``env`` asked at this tick: it keeps its last command instead of idling until the next tick."""
        return self._asked_at_tick[env] == self._tick
