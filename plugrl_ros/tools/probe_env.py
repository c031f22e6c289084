"""The probe environment (docs/protocol.md): observations that reveal what the client did.

Env i keeps ``t`` (steps taken this episode) and ``a`` (the action applied
on its last step). Every step stores the action, adds one to ``t`` and earns
reward 1.0; the episode terminates when ``t`` reaches ``3 + 2 * (i % 3)``.
A trainer that sends action values ``10000 * k + 10 * env + dim`` can then
read, from each feedback alone, whether the client summed the chunk's reward,
sent the terminal observation, and applied the chunk time-major and in order.
"""

from __future__ import annotations

import numpy as np

from plugrl_ros.protocol.messages import ObservationRow


def episode_length(env: int) -> int:
    """The probe episode length of env ``env``: 3, 5, 7, 3, 5, 7, ..."""
    return 3 + 2 * (env % 3)


def action_value(step: int, env: int, dim: int) -> float:
    """What a conformance trainer sends as ``action[step, row_of(env), dim]``."""
    return 10000.0 * step + 10.0 * env + dim


class ProbeEnvs:
    """``n`` probe envs with ``action_dim``-wide actions, stepped in-process."""

    def __init__(self, n: int, action_dim: int, episode_steps: int = 0) -> None:
        self.n = n
        self.action_dim = action_dim
        # 0: the probe's own lengths (3, 5, 7, ...); else every episode this long (benchmarks of long
        # chunks: a 3-step episode would end every chunk early; a probe-checking trainer then fails it)
        self.episode_steps = episode_steps
        self.t = np.zeros(n, dtype=np.int64)
        self.a = np.zeros((n, action_dim), dtype=np.float64)

    def step(self, env: int, action: np.ndarray) -> tuple[float, bool]:
        """Apply one action to env ``env``: (reward, terminated)."""
        self.a[env] = np.asarray(action, dtype=np.float64).reshape(self.action_dim)
        self.t[env] += 1
        return 1.0, bool(self.t[env] >= (self.episode_steps or episode_length(env)))

    def reset(self, env: int) -> None:
        self.t[env] = 0
        self.a[env] = 0.0

    def row(self, env: int) -> ObservationRow:
        """A snapshot of env ``env``'s observation (copies: the env moves on)."""
        return ObservationRow(
            states={"t": np.array([float(self.t[env])]), "a": self.a[env].copy()},
            text="",
        )
