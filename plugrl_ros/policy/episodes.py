"""One robot's episodes in deploy mode: when one begins and ends, its return, and when to reset.

Deploy mode reads the same ``reward`` and ``episode`` topics as train mode,
but only to count: nothing of them goes to the policy server. An episode
begins with the first action a policy chunk applies after a reset (or at
start), so ticks spent waiting for the server are not part of it, and the
reward window opens then. From then on every control tick in which the robot
steps is one step of it; it ends when the robot says so (``terminated`` /
``truncated``) or after ``max_steps`` steps (truncated), and then the robot
is reset (``reset.mode``) before the next one begins. Its return is the sum
of every reward the robot published between its first action and its end.

Pure bookkeeping, no ROS: the node feeds it each tick's step result and asks
it what the robot should do.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

RECENT = 20  # episodes in the "recent mean return"


class Phase(enum.Enum):
    WAITING = "waiting for the policy's first action"  # no episode runs: the next action begins one
    RUNNING = "running"
    RESETTING = "resetting"  # an episode ended (or the bridge started): the robot must be reset first


@dataclass(frozen=True)
class EpisodeEnd:
    """A finished episode: its return, its length in steps, whether it succeeded, and how it ended."""

    ret: float
    length: int
    success: bool
    terminated: bool  # the robot ended it; False: truncated (robot, max_steps, pause)


class EpisodeTracker:
    """Episodes of one robot; :attr:`phase` says what the node does with it on a tick."""

    def __init__(self, max_steps: int, resets: bool, reset_on_start: bool) -> None:
        """``resets``: episodes end with a reset (``reset.mode`` is not ``none``)."""
        assert max_steps >= 0
        self.max_steps = max_steps
        self.resets = resets
        self.phase = Phase.RESETTING if resets and reset_on_start else Phase.WAITING
        self.ret = 0.0
        self.length = 0
        self.success = False
        self.episodes = 0
        self.successes = 0
        self.total_return = 0.0
        self.last: EpisodeEnd | None = None
        self.recent: deque[float] = deque(maxlen=RECENT)

    @property
    def running(self) -> bool:
        return self.phase is Phase.RUNNING

    def begin(self) -> None:
        """The first action of an episode goes out now (the reward window opens with it): step 1."""
        assert self.phase is Phase.WAITING
        self.phase = Phase.RUNNING
        self.ret = 0.0
        self.length = 1
        self.success = False

    def result(self, reward: float, terminated: bool, truncated: bool, success: bool) -> EpisodeEnd | None:
        """What the robot reported since the last step; the episode's end if this ends it.

        Not ended: the caller takes one more step (:meth:`stepped`).
        """
        assert self.phase is Phase.RUNNING
        self.ret += reward
        self.success = self.success or success
        if terminated or truncated:
            return self._end(terminated)
        if self.max_steps and self.length >= self.max_steps:
            return self._end(False)
        return None

    def stepped(self) -> None:
        """One more step of the running episode went out (an action or, waiting for a chunk, the idle command)."""
        assert self.phase is Phase.RUNNING
        self.length += 1

    def truncate(self, reward: float, success: bool) -> EpisodeEnd | None:
        """The robots were stopped (pause, dead-man switch): a running episode ends here, truncated."""
        if self.phase is not Phase.RUNNING:
            return None
        self.ret += reward
        self.success = self.success or success
        return self._end(False)

    def reset_done(self) -> None:
        assert self.phase is Phase.RESETTING
        self.phase = Phase.WAITING

    def mean_return(self) -> float | None:
        """The mean return of every episode so far."""
        return self.total_return / self.episodes if self.episodes else None

    def recent_mean_return(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None

    def _end(self, terminated: bool) -> EpisodeEnd:
        end = EpisodeEnd(self.ret, self.length, self.success, terminated)
        self.episodes += 1
        self.successes += int(self.success)
        self.total_return += self.ret
        self.recent.append(self.ret)
        self.last = end
        self.phase = Phase.RESETTING if self.resets else Phase.WAITING
        return end
