"""The demo trainer's learner: a linear-Gaussian policy learning by chunk-level policy gradient, with no I/O.

The policy is linear-Gaussian over the observation's states (concatenated by
name, normalised by running statistics): ``u = W [z, 1] + std * noise``. Each
infer gets, per env, one such joint command held for the whole chunk of H
steps (action repeat). Learning is REINFORCE at chunk granularity: every chunk
is one decision whose reward is the chunk-summed reward of its feedback;
returns-to-go are discounted per chunk, and a baseline fitted by least squares
on the chunk's start state, its step id and the episode's previous chunk
reward takes out most of the variance that random start and target poses
bring. After every ``batch_episodes`` finished episodes, one Adam step updates
``W`` and the exploration noise; the step size decays and the noise has a
floor, so a learned policy does not drift away again in a long run. Episodes
that end by the time limit are treated as ended (no bootstrapping): a
simplification a demo can afford.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from plugrl_ros.protocol.errors import ProtocolError

_MAX_STD = 2.0
_ADAM_BETAS = (0.9, 0.999)
_RIDGE = 1e-3


@dataclass(frozen=True)
class DemoTrainerSettings:
    """Where the trainer listens, how long the run lasts, and the learning hyperparameters."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0 = pick a free port
    duration_s: float = 180.0  # the run ends this long after the first connection
    horizon: int = 5  # H: steps per action chunk (one command, repeated)
    action_dim: int = 2
    seed: int = 0
    gamma: float = 0.5  # discount per chunk
    learning_rate: float = 0.1  # Adam step size for W, at first ...
    learning_rate_decay: float = 0.05  # ... then divided by sqrt(1 + this * updates)
    std_learning_rate: float = 0.05  # Adam step size for log(std)
    initial_std: float = 1.0  # exploration noise at the start, in action units
    min_std: float = 0.2  # the noise never drops below this: a near-deterministic policy's gradient is all noise
    batch_episodes: int = 16  # finished episodes per update
    feedback_timeout_s: float = 60.0  # as a PlugRL server: no feedback this long after an action closes

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is not in 0..65535")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s: {self.duration_s} must be a positive number of seconds")
        for name in ("horizon", "action_dim", "batch_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)} must be at least 1")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma: {self.gamma} must be in [0, 1]")
        for name in ("learning_rate", "std_learning_rate", "feedback_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: {getattr(self, name)} must be positive")
        if not 0 < self.min_std <= self.initial_std <= _MAX_STD:
            raise ValueError(
                f"min_std {self.min_std}, initial_std {self.initial_std}: need 0 < min_std <= initial_std <= {_MAX_STD}"
            )
        if not self.learning_rate_decay >= 0:
            raise ValueError(f"learning_rate_decay: {self.learning_rate_decay} must not be negative")


class _Adam:
    def __init__(self, shape: tuple[int, ...], step_size: float) -> None:
        self.m = np.zeros(shape)
        self.v = np.zeros(shape)
        self.t = 0
        self.step_size = step_size

    def ascend(self, gradient: np.ndarray) -> np.ndarray:
        b1, b2 = _ADAM_BETAS
        self.t += 1
        self.m = b1 * self.m + (1 - b1) * gradient
        self.v = b2 * self.v + (1 - b2) * gradient * gradient
        m_hat = self.m / (1 - b1**self.t)
        v_hat = self.v / (1 - b2**self.t)
        return self.step_size * m_hat / (np.sqrt(v_hat) + 1e-8)


@dataclass
class Chunk:
    """One decision: the normalised start state, the noise drawn, where it was in the episode, and its reward."""

    z: np.ndarray
    noise: np.ndarray
    step_id: int
    previous_reward: float | None  # the episode's previous chunk reward, None for its first known chunk
    reward: float = 0.0


class PolicyGradient:
    """The policy and its learning rule, fed chunk by chunk; deterministic for a seed and an input order."""

    def __init__(self, settings: DemoTrainerSettings) -> None:
        self.settings = settings
        self._rng = np.random.default_rng(settings.seed)
        self.state_dim: int | None = None
        self.weights = np.zeros((settings.action_dim, 1))
        self.log_std = np.full(settings.action_dim, math.log(settings.initial_std))
        self._adam_w = _Adam(self.weights.shape, settings.learning_rate)
        self._adam_std = _Adam(self.log_std.shape, settings.std_learning_rate)
        # running statistics of the states (Welford), and the snapshot the policy normalises with
        self._count = 0
        self._mean = np.zeros(0)
        self._m2 = np.zeros(0)
        self._norm_mean = np.zeros(0)
        self._norm_std = np.ones(0)
        self._batch: list[list[Chunk]] = []
        self._batch_returns: list[np.ndarray] = []
        self.updates = 0

    @property
    def std(self) -> np.ndarray:
        return np.exp(self.log_std)

    def _ensure_dim(self, dim: int) -> None:
        if self.state_dim is None:
            self.state_dim = dim
            self.weights = np.zeros((self.settings.action_dim, dim + 1))
            self._adam_w = _Adam(self.weights.shape, self.settings.learning_rate)
            self._mean = np.zeros(dim)
            self._m2 = np.zeros(dim)
            self._norm_mean = np.zeros(dim)
            self._norm_std = np.ones(dim)
        elif dim != self.state_dim:
            raise ProtocolError(
                "data.states", f"the states add up to {dim} values; earlier observations had {self.state_dim}"
            )

    def act(self, states: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Commands for ``states`` [n, d]: (actions [n, da], normalised states [n, d], noise [n, da])."""
        self._ensure_dim(states.shape[1])
        for s in states:
            self._count += 1
            delta = s - self._mean
            self._mean += delta / self._count
            self._m2 += delta * (s - self._mean)
        z = (states - self._norm_mean) / self._norm_std
        phi = np.hstack([z, np.ones((len(z), 1))])
        noise = self._rng.standard_normal((len(z), self.settings.action_dim))
        return phi @ self.weights.T + self.std * noise, z, noise

    def linear_policy(self) -> tuple[np.ndarray, np.ndarray]:
        """The learned policy's mean action as ``W @ states + b`` in raw state units (no noise).

        The normalisation is folded in, so a plain linear policy server
        (``plugrl-test-policy-server --linear``) can serve it: ``W = W_z / std``
        and ``b = W_b - W_z @ (mean / std)``, with ``W_z`` the weights of the
        normalised states and ``W_b`` the bias column.
        """
        if self.state_dim is None:
            raise ValueError("no state has been seen yet: the policy has no input width")
        w_z, w_b = self.weights[:, :-1], self.weights[:, -1]
        return w_z / self._norm_std, w_b - w_z @ (self._norm_mean / self._norm_std)

    def episode_done(self, chunks: list[Chunk]) -> bool:
        """Take a finished episode's chunks; True if that completed a batch and the policy was updated."""
        if not chunks:
            return False
        self._batch.append(chunks)
        if len(self._batch) < self.settings.batch_episodes:
            return False
        self._update()
        return True

    def _update(self) -> None:
        chunks = [c for episode in self._batch for c in episode]
        returns = np.concatenate([self._returns_to_go(episode) for episode in self._batch])
        self._batch = []
        z = np.array([c.z for c in chunks])
        noise = np.array([c.noise for c in chunks])
        advantage = returns - self._baseline(z, chunks, returns)
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        phi = np.hstack([z, np.ones((len(z), 1))])
        # d log N(u; W phi, std) / dW = (u - W phi) phi^T / std^2 = noise phi^T / std
        grad_w = (noise * advantage[:, None]).T @ phi / len(chunks) / self.std[:, None]
        # d log N / d log std = noise^2 - 1
        grad_log_std = ((noise**2 - 1) * advantage[:, None]).mean(axis=0)
        # Adam's steps keep their size however weak the signal gets; near the
        # optimum that is a random walk away from it, so the steps shrink.
        decay = 1.0 / math.sqrt(1.0 + self.settings.learning_rate_decay * self.updates)
        self.weights = self.weights + decay * self._adam_w.ascend(grad_w)
        self.log_std = np.clip(
            self.log_std + self._adam_std.ascend(grad_log_std), math.log(self.settings.min_std), math.log(_MAX_STD)
        )
        if self._count > 1:
            self._norm_mean = self._mean.copy()
            self._norm_std = np.sqrt(np.maximum(self._m2 / self._count, 1e-4))
        self.updates += 1

    def _returns_to_go(self, episode: list[Chunk]) -> np.ndarray:
        out = np.empty(len(episode))
        total = 0.0
        for i in range(len(episode) - 1, -1, -1):
            total = episode[i].reward + self.settings.gamma * total
            out[i] = total
        return out

    @staticmethod
    def _baseline(z: np.ndarray, chunks: list[Chunk], returns: np.ndarray) -> np.ndarray:
        """Least-squares fit of the returns on what was known before each chunk's noise was drawn.

        The previous chunk's reward is the strongest of these: it says how
        far from the target the arm was, which the linear state features
        cannot. Anything decided before the noise keeps the gradient unbiased.
        """
        t = np.array([c.step_id for c in chunks], dtype=np.float64)[:, None] / 10.0
        first = np.array([c.previous_reward is None for c in chunks], dtype=np.float64)[:, None]
        p = np.array([c.previous_reward or 0.0 for c in chunks], dtype=np.float64)[:, None]
        features = np.hstack([z, z**2, t, t**2, t**3, np.ones_like(t), first, p, p**2, p**3])
        gram = features.T @ features + _RIDGE * np.eye(features.shape[1])
        coefficients = np.linalg.solve(gram, features.T @ returns)
        return features @ coefficients
