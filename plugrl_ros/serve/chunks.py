"""How an action chunk maps to an RL step: one RL step per chunk, the policy emits the whole chunk.

PlugRL answers each infer with H steps per env and gets back one feedback
per chunk: the reward summed over the steps that ran and the observation
after the last one. So the decision the learner sees is the chunk. The
RLModule's action is the whole chunk, flattened time-major to
``[H * action_dim]`` (RLlib's action distributions take flat boxes), and one
RL step is one chunk: its reward is the chunk's sum, and a discount of
``gamma_step`` per control step is ``gamma_step ** H`` per RL step
(:func:`chunk_gamma`). That discount is exact for an RL step that spans
all H control steps. A chunk ends early where the episode ends (its last
RL step, where the discount does not matter), but the bridge also cuts chunks
short when a sensor goes stale mid-chunk, when a feedback deadline passes,
and every ``control.replan_steps`` (a pause truncates the episode): such an RL step spans
fewer control steps, and its successor is discounted by ``gamma_step ** H``
all the same, a little too much. The feedback does not say how many steps ran,
so the runner cannot correct it. H = 1 is one RL step per action, always exact.

RLlib's step counters (``num_env_steps_sampled``, episode lengths) count RL
steps, that is chunks; the robots took up to H times as many steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class ChunkMapping:
    """H control steps of ``action_dim`` values per RL step."""

    horizon: int
    action_dim: int

    def __post_init__(self) -> None:
        if self.horizon < 1:
            raise ValueError(f"horizon: {self.horizon} must be at least 1 (steps per action chunk)")
        if self.action_dim < 1:
            raise ValueError(f"action_dim: {self.action_dim} must be at least 1")

    def chunk_space(self, step_space: gym.spaces.Box) -> gym.spaces.Box:
        """The RL step's action space: ``step_space`` repeated for each of the H steps, flattened."""
        assert step_space.shape == (self.action_dim,), (step_space.shape, self.action_dim)
        low = np.tile(step_space.low, self.horizon)
        high = np.tile(step_space.high, self.horizon)
        return gym.spaces.Box(low, high, dtype=step_space.dtype)

    def to_chunk(self, actions: np.ndarray) -> np.ndarray:
        """The wire's time-major chunk ``[H, n, action_dim]`` (float32) from n RL actions ``[n, H * action_dim]``."""
        n = actions.shape[0]
        if actions.shape[1:] != (self.horizon * self.action_dim,):
            raise ValueError(
                f"the policy's actions are {list(actions.shape[1:])} per env; "
                f"a chunk of {self.horizon} x {self.action_dim} needs [{self.horizon * self.action_dim}]"
            )
        steps = np.asarray(actions, dtype="<f4").reshape(n, self.horizon, self.action_dim)
        return np.ascontiguousarray(steps.transpose(1, 0, 2))

    @classmethod
    def of(cls, action_space: gym.spaces.Space, horizon: int) -> ChunkMapping:
        """The mapping an RL action space of ``[H * action_dim]`` implies (ValueError if it is not one)."""
        if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
            raise ValueError(f"the action space must be a flat Box [horizon * action_dim], got {action_space}")
        size = action_space.shape[0]
        if size % horizon:
            raise ValueError(
                f"the action space's {size} values are not a whole chunk of horizon {horizon}: "
                "build it with robot_spaces(..., horizon=H) and give the runner the same horizon"
            )
        return cls(horizon, size // horizon)


def chunk_gamma(gamma_step: float, horizon: int) -> float:
    """The discount per RL step (per chunk) that a discount of ``gamma_step`` per control step amounts to."""
    if not 0 <= gamma_step <= 1:
        raise ValueError(f"gamma_step: {gamma_step} must be in [0, 1]")
    return gamma_step**horizon
