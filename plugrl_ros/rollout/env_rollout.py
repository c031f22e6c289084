"""One env's action chunk, step accounting and episode, independent of how it steps.

The env executes its chunk one step at a time: :meth:`EnvRollout.take_step`
hands out the next action, :meth:`EnvRollout.finish_step` records what that
step produced. When the chunk ends (all its steps ran, the episode ended, or
it was cut short) the result waits in :attr:`EnvRollout.pending` until the
scheduler puts it in a feedback. The accounting here is where the protocol's
data rules are kept: the reward fed back is the sum over the steps that ran,
the observation is the one after the last step that ran, and a terminal
step's observation is the terminal one (the reset comes afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plugrl_ros.protocol.messages import ObservationRow


@dataclass(frozen=True)
class EpisodeSummary:
    """``info["episode"]`` values for a row whose episode ended."""

    ret: float
    length: int
    success: bool


@dataclass(frozen=True)
class PendingFeedback:
    """A finished chunk, waiting for its feedback slot."""

    row: ObservationRow
    reward: float
    terminated: bool
    truncated: bool
    step_id: int
    steps: int
    episode: EpisodeSummary | None

    @property
    def ends_episode(self) -> bool:
        return self.terminated or self.truncated


class EnvRollout:
    """One env's protocol-side state: its chunk, its held feedback, its episode."""

    def __init__(self, index: int, max_episode_steps: int = 0, resets: bool = True) -> None:
        self.index = index
        self._max_episode_steps = max_episode_steps
        self._resets = resets  # a reset procedure is configured (else the task is continuing)
        self.chunk: np.ndarray | None = None  # [h, width] float64
        self.next_step = 0
        self.step_in_flight = False
        self.cut = False  # end the chunk after the step in flight
        self.truncate = False  # ... and truncate the episode there
        self.chunk_reward = 0.0
        self.pending: PendingFeedback | None = None
        self.inferring = False
        self.step_id = 0  # chunks completed in this episode
        self.episode_return = 0.0
        self.episode_length = 0
        self.episode_success = False
        self.needs_reset = False
        # a step whose chunk was lost (the connection closed) but whose result
        # is still due: the robot did take it, so it still counts
        self.detached = False
        # a new connection came while that step was in flight: start a fresh episode once it reports
        self.restart_after_step = False
        # the robot stopped reporting during the first step of this chunk: the
        # chunk can neither run nor be fed back, only dropped with the connection
        self.frozen = False
        self.last_row: ObservationRow | None = None  # the observation after the chunk's last completed step
        # lifetime counters
        self.episodes = 0
        self.steps_total = 0
        self.chunks_lost = 0
        self.last_return: float | None = None

    # -- state -----------------------------------------------------------

    @property
    def holds_action(self) -> bool:
        """Received an action that has not been fed back yet."""
        return self.chunk is not None or self.pending is not None

    @property
    def idle(self) -> bool:
        """Holds no action, is not resetting or mid-step: may go into an infer once its observation is fresh."""
        return not self.holds_action and not self.inferring and not self.needs_reset and not self.step_in_flight

    @property
    def on_last_step(self) -> bool:
        """The step in flight is the chunk's last, so the chunk ends with its result."""
        return self.chunk is not None and self.step_in_flight and (self.next_step >= len(self.chunk) or self.cut)

    # -- the chunk -------------------------------------------------------

    def start_chunk(self, actions: np.ndarray) -> None:
        assert self.inferring and not self.holds_action, f"env {self.index} got a chunk it did not ask for"
        self.inferring = False
        self.chunk = actions
        self.next_step = 0
        self.step_in_flight = False
        self.cut = False
        self.truncate = False
        self.chunk_reward = 0.0
        self.last_row = None

    def take_step(self) -> np.ndarray | None:
        """The action of the next step, now in flight; None if there is no step to take."""
        if self.chunk is None or self.step_in_flight or self.frozen:
            return None
        action = self.chunk[self.next_step]
        self.next_step += 1
        self.step_in_flight = True
        return action

    def finish_step(
        self,
        reward: float,
        terminated: bool,
        truncated: bool,
        success: bool,
        row: ObservationRow,
        interrupted: bool = False,
    ) -> bool:
        """Record the in-flight step's result; True if that ended the chunk.

        ``interrupted``: the env could not observe for a while during this step
        (stale sensors); the rest of the chunk was planned for a state long
        gone, so the chunk ends here and a fresh one is asked for.
        """
        assert self.step_in_flight and (self.chunk is not None or self.detached), f"env {self.index}: no step"
        self.step_in_flight = False
        self.chunk_reward += reward
        self.episode_return += reward
        self.episode_length += 1
        self.episode_success = self.episode_success or success
        self.steps_total += 1
        truncated = truncated or self.truncate
        if not terminated and self._max_episode_steps > 0 and self.episode_length >= self._max_episode_steps:
            truncated = True
        ended = terminated or truncated
        if self.detached:
            # nothing to feed back (that connection is gone), but the episode
            # may have ended on this step: the env must still reset
            self.detached = False
            if ended:
                self._episode_ended()
                self._new_episode()
            elif self.restart_after_step:
                self._restart()
            self.restart_after_step = False
            return False
        if not (ended or interrupted or self.cut or self.next_step >= len(self.chunk)):
            self.last_row = row
            return False
        episode = None
        if ended:
            episode = EpisodeSummary(self.episode_return, self.episode_length, self.episode_success)
        self.pending = PendingFeedback(
            row=row,
            reward=self.chunk_reward,
            terminated=bool(terminated),
            truncated=bool(truncated and not terminated),
            step_id=self.step_id,
            steps=self.next_step,
            episode=episode,
        )
        self.chunk = None
        if ended:
            # The terminal observation is captured; the env may reset while
            # its feedback waits for a slot.
            self._episode_ended()
        return True

    def fail(self) -> bool:
        """The step in flight will not report (the robot or its sensors failed): give it up.

        No transition may span the failure, so the episode is truncated at the
        last step that reported: the feedback carries that step's observation
        and the reward of the steps before it. True if so; False if not one
        step of the chunk had reported: then the chunk cannot be fed back
        (a feedback needs at least one step) and must go with the connection.
        """
        assert self.step_in_flight
        self.step_in_flight = False
        completed = self.next_step - 1
        if self.chunk is None:  # a detached step: its chunk already went with a connection
            self.detached = False
            self.restart_after_step = False
            self._episode_ended()
            self._new_episode()
            return True
        if completed == 0:
            self.frozen = True
            self._episode_ended()
            self._new_episode()  # whatever comes next starts a new episode, not this dead one
            return False
        self.pending = PendingFeedback(
            row=self.last_row,
            reward=self.chunk_reward,
            terminated=False,
            truncated=True,
            step_id=self.step_id,
            steps=completed,
            episode=EpisodeSummary(self.episode_return, self.episode_length, self.episode_success),
        )
        self.chunk = None
        self._episode_ended()
        return True

    def _episode_ended(self) -> None:
        self.needs_reset = True
        self.episodes += 1
        self.last_return = self.episode_return

    def fed_back(self) -> PendingFeedback:
        """The pending feedback went out: the next chunk is a new one (or a new episode)."""
        pending = self.pending
        assert pending is not None
        self.pending = None
        if pending.ends_episode:
            self._new_episode()
        else:
            self.step_id += 1
        return pending

    def lose_action(self) -> bool:
        """The connection closed: any chunk, held feedback or request is gone. True if one was."""
        lost = self.holds_action or self.inferring
        if self.pending is not None and self.pending.ends_episode:
            # the episode did end; only its feedback is lost
            self._new_episode()
        self.chunk = None
        self.pending = None
        self.inferring = False
        self.frozen = False
        self.detached = self.step_in_flight
        if lost:
            self.chunks_lost += 1
        return lost

    def start_fresh(self) -> None:
        """The trainer knows nothing of this env's episode (a new connection, or startup): begin a new one.

        On every close the trainer forgets each env's state, so an episode begun
        on an earlier connection would reach it headless: its return, length and
        time limit would count steps it never saw. With a reset configured the
        robot is reset first; without one (a continuing task) the next
        observation simply starts the episode. A step the robot is still taking
        finishes first.
        """
        if self.step_in_flight:
            self.restart_after_step = True
        elif not self.needs_reset and self.episode_length > 0:
            self._restart()

    def _restart(self) -> None:
        self._new_episode()
        self.needs_reset = self._resets

    def reset_done(self) -> None:
        self.needs_reset = False

    def _new_episode(self) -> None:
        self.step_id = 0
        self.episode_return = 0.0
        self.episode_length = 0
        self.episode_success = False
