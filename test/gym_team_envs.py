"""A team's own Gymnasium env, in a module of its own that registers it on import: what
``plugrl-gym-robot --env gym_team_envs:PlugrlTeamDict-v0`` (``module:ID``, as ``gymnasium.make`` reads it)
brings up. Its observation is a Dict (one state per key through the bridge)."""

from __future__ import annotations

import gymnasium
import numpy as np
from gymnasium import spaces


class TeamDictEnv(gymnasium.Env):
    """A point pushed by its action: a float64 position, a float32 velocity and a Discrete mode (which quadrant
    it is in). It ends (terminated) when it leaves the square |x|, |y| < 2; Gymnasium's limit truncates it."""

    observation_space = spaces.Dict(
        {
            "pos": spaces.Box(-10.0, 10.0, (2,), np.float64),
            "vel": spaces.Box(-5.0, 5.0, (2,), np.float32),
            "mode": spaces.Discrete(4),
        }
    )
    action_space = spaces.Box(-1.0, 1.0, (2,), np.float64)

    def _observation(self) -> dict:
        mode = int(self.pos[0] > 0) + 2 * int(self.pos[1] > 0)
        return {"pos": self.pos.copy(), "vel": self.vel.copy(), "mode": mode}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1.0, 1.0, 2)
        self.vel = np.zeros(2, np.float32)
        return self._observation(), {}

    def step(self, action):
        self.vel = (0.5 * self.vel + np.asarray(action, np.float32) * np.float32(0.3)).astype(np.float32)
        self.pos = self.pos + self.vel.astype(np.float64)
        reward = float(-np.abs(self.pos).sum())
        return self._observation(), reward, bool(np.abs(self.pos).max() >= 2.0), False, {}


gymnasium.register(id="PlugrlTeamDict-v0", entry_point=TeamDictEnv, max_episode_steps=30)
