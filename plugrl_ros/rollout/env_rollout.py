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
class StepsExecuted:
    """What a chunk's steps that ran executed, when a person may have commanded some of them."""

    horizon: int  # the chunk's H, as the trainer sent it
    actions: np.ndarray  # [steps, width]: the action each step executed (the chunk's, or what replaced it)
    active: np.ndarray  # bool [steps]: the step's action was not the chunk's (a person's, or an idle)
    person: np.ndarray  # bool [steps]: a person commanded the step


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
    executed: StepsExecuted | None = None  # with interventions configured

    @property
    def ends_episode(self) -> bool:
        return self.terminated or self.truncated


class EnvRollout:
    """One env's protocol-side state: its chunk, its held feedback, its episode."""

    def __init__(
        self, index: int, max_episode_steps: int = 0, resets: bool = True, interventions: bool = False
    ) -> None:
        """``interventions``: a person may command steps; each feedback then says what every step executed."""
        self.index = index
        self._interventions = interventions
        self.horizon = 0  # the held chunk's H, as the trainer sent it
        # The held chunk was computed for the robot's current state: no person moved the robot since its
        # observation. A chunk that was not is never resumed by the policy (the robot idles through it).
        self.fresh_chunk = True
        self._person_moved = False  # a person moved the robot since the last infer's observation
        self._executed: np.ndarray | None = None  # the held chunk's steps as executed, once one was replaced
        self._active: np.ndarray | None = None
        self._person: np.ndarray | None = None
        self.person_steps = 0  # lifetime: steps a person commanded
        self.replaced_steps = 0  # lifetime: steps that ran something else than the chunk's action
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

    def start_chunk(self, actions: np.ndarray, horizon: int | None = None) -> None:
        assert self.inferring and not self.holds_action, f"env {self.index} got a chunk it did not ask for"
        self.inferring = False
        self.chunk = actions
        self.horizon = len(actions) if horizon is None else horizon
        self.fresh_chunk = not self._person_moved
        self._executed = self._active = self._person = None
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

    @property
    def policy_may_act(self) -> bool:
        """No person moved the robot since the observation of the held chunk (or of the one asked for)."""
        return self.fresh_chunk and not self._person_moved

    def asked(self) -> None:
        """An infer with this env's current observation went out."""
        self.inferring = True
        self._person_moved = False

    def person_moved(self) -> None:
        """A person's command went out: the held chunk, and any chunk asked for before, no longer fit the state."""
        self._person_moved = True
        self.fresh_chunk = False

    def cut_chunk(self) -> None:
        """End the held chunk after its step in flight (or the next one, if none is)."""
        if self.chunk is not None:
            self.cut = True

    def replaced(self, action: np.ndarray, person: bool) -> None:
        """The step in flight executed ``action`` instead of the chunk's (``person``: a person commanded it)."""
        assert self.step_in_flight and self.chunk is not None, f"env {self.index}: no chunk step in flight"
        if self._executed is None:
            self._executed = np.array(self.chunk, dtype=np.float64)
            self._active = np.zeros(len(self.chunk), dtype=np.bool_)
            self._person = np.zeros(len(self.chunk), dtype=np.bool_)
        assert self._active is not None and self._person is not None
        k = self.next_step - 1
        self._executed[k] = action
        self._active[k] = True
        self._person[k] = person
        self.replaced_steps += 1
        self.person_steps += person

    def _steps_executed(self, steps: int) -> StepsExecuted | None:
        if not self._interventions:
            return None
        assert self.chunk is not None
        if self._executed is None:
            none = np.zeros(steps, dtype=np.bool_)
            return StepsExecuted(self.horizon, self.chunk[:steps], none, none)
        assert self._active is not None and self._person is not None
        return StepsExecuted(self.horizon, self._executed[:steps], self._active[:steps], self._person[:steps])

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
            executed=self._steps_executed(self.next_step),
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
            executed=self._steps_executed(completed),
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
