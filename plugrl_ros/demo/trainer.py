"""``plugrl-demo-trainer``: the demo's small PlugRL trainer, a linear policy learning by policy gradient.

A fixture that learns for real, not a product. The policy is linear-Gaussian
over the observation's states (concatenated by name, normalised by running
statistics; images travel through the pipeline but this policy does not use
them): ``u = W [z, 1] + std * noise``. Each infer gets, per env, one such
joint command held for the whole chunk of H steps (action repeat). Learning
is REINFORCE at chunk granularity: every chunk is one decision whose reward
is the chunk-summed reward of its feedback; returns-to-go are discounted per
chunk, and a baseline fitted by least squares on the chunk's start state, its
step id and the episode's previous chunk reward takes out most of the
variance that random start and target poses bring. After every
``batch_episodes`` finished episodes, one Adam step updates ``W`` and the
exploration noise; the step size decays and the noise has a floor, so a
learned policy does not drift away again in a long run. Episodes that end by the time limit are treated as ended
(no bootstrapping): a simplification a demo can afford.

Per connection it keeps what the protocol asks of a server: the observation
of each env's last feedback (for the ``reuse-feedback-obs`` feature), which
env holds an action, and each env's chunks of the running episode; all of it
is forgotten when the connection closes. After ``duration_s`` (counted from
the first connection) it ends the run: close 1001 ``plugrl-server-stop``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ConnectionClosed

from plugrl_ros.protocol.client import RESYNC_REASON, STOP_REASON
from plugrl_ros.protocol.codec import packb, unpackb
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.messages import ACTION, FEEDBACK, INFER, METADATA, REUSE_FEEDBACK_OBS, message_type
from plugrl_ros.tools.serving import serve_trainer

log = logging.getLogger("plugrl_ros.demo.trainer")

SERVER_NAME = "plugrl-demo-trainer"
ALGORITHM = "chunk-level policy gradient (REINFORCE, fitted baseline, Adam) on a linear-Gaussian policy"
FEEDBACK_TIMEOUT_REASON = "Feedback timeout"
RECENT_EPISODES = 20  # "recent mean return" is over this many episodes
_CLOSE_TIMEOUT_S = 5.0
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


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode, as the client reported it."""

    time_s: float  # since the first connection
    env: int
    ret: float
    length: int  # steps; 0 when the client did not say


@dataclass(frozen=True)
class TrainerStats:
    """A snapshot for a progress display."""

    connected: int  # open connections
    elapsed_s: float  # since the first connection (0 before it)
    chunks: int  # actions sent
    episodes: int
    recent_mean_return: float | None  # over the last RECENT_EPISODES episodes
    updates: int
    policy_std: float
    finished: bool


# -- the learner: no I/O ----------------------------------------------------------------


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
class _Chunk:
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
        self._batch: list[list[_Chunk]] = []
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

    def episode_done(self, chunks: list[_Chunk]) -> bool:
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

    def _returns_to_go(self, episode: list[_Chunk]) -> np.ndarray:
        out = np.empty(len(episode))
        total = 0.0
        for i in range(len(episode) - 1, -1, -1):
            total = episode[i].reward + self.settings.gamma * total
            out[i] = total
        return out

    @staticmethod
    def _baseline(z: np.ndarray, chunks: list[_Chunk], returns: np.ndarray) -> np.ndarray:
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


# -- one connection's exchange, without I/O ----------------------------------------------


def _indices(message: Mapping, key: str) -> list[int]:
    value = message.get(key)
    if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.kind not in "iu":
        raise ProtocolError(key, "must be an int array of shape [n]")
    out = [int(v) for v in value.tolist()]
    if len(set(out)) != len(out):
        raise ProtocolError(key, f"{out[:16]} repeats an env")
    return out


def _flags(data: Mapping, key: str, m: int) -> np.ndarray:
    value = data.get(key)
    if not isinstance(value, np.ndarray) or value.shape != (m,) or value.dtype.kind not in "biu":
        raise ProtocolError(key, f"must be a bool array of shape [{m}]")
    return value.astype(bool)


def state_rows(obs: Any, rows: int, where: str) -> np.ndarray:
    """The observation's states, concatenated in name order: float64 [rows, d]."""
    if not isinstance(obs, dict) or not isinstance(obs.get("states"), dict):
        raise ProtocolError(where, "must be a map with a 'states' map")
    parts = []
    for name in sorted(obs["states"]):
        array = obs["states"][name]
        if not isinstance(array, np.ndarray) or array.ndim != 2 or array.dtype.kind not in "fiu":
            raise ProtocolError(f"{where}.states.{name}", "must be a numeric array of shape [n, d]")
        if array.shape[0] != rows:
            raise ProtocolError(f"{where}.states.{name}", f"has {array.shape[0]} rows, expected {rows}")
        parts.append(array.astype(np.float64))
    if not parts:
        raise ProtocolError(f"{where}.states", "is empty; this trainer's policy needs at least one state")
    states = np.hstack(parts)
    if not np.isfinite(states).all():
        raise ProtocolError(f"{where}.states", "holds NaN or infinite values")
    return states


def _episode_info(info: Any, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(mask, returns, lengths) from ``info["episode"]``, or None when the client sent none."""
    if not isinstance(info, dict) or not isinstance(info.get("episode"), dict):
        return None
    episode = info["episode"]
    try:
        mask = np.asarray(episode["mask"], dtype=bool).reshape(m)
        returns = np.asarray(episode["r"], dtype=np.float64).reshape(m)
        lengths = np.asarray(episode.get("l", np.zeros(m)), dtype=np.float64).reshape(m)
    except (KeyError, ValueError, TypeError):
        raise ProtocolError("info.episode", f"must hold r, l and mask arrays of length {m}") from None
    return mask, returns, lengths


@dataclass
class Session:
    """What the trainer knows about one connection's envs; dropped, all of it, when the connection closes."""

    learner: PolicyGradient
    horizon: int
    expect: str = INFER
    last_obs: dict[int, np.ndarray] = field(default_factory=dict)  # the observation of each env's last feedback
    last_ended: dict[int, bool] = field(default_factory=dict)
    holding: dict[int, _Chunk] = field(default_factory=dict)  # envs with an action and no feedback yet
    episodes: dict[int, list[_Chunk]] = field(default_factory=dict)  # each env's chunks of its running episode

    def receive(self, message: Any) -> tuple[bytes | None, list[tuple[int, float, int]]]:
        """One client message: (the action frame to send or None, the episodes it ended as (env, return, length))."""
        if self.expect == INFER:
            message_type(message, INFER)
            return self._infer(message), []
        message_type(message, FEEDBACK)
        return None, self._feedback(message)

    def _infer(self, message: dict) -> bytes:
        envs = _indices(message, "env_indices")
        step_ids = _step_ids(message, "step_ids", len(envs))
        n = len(envs)
        if n == 0:
            raise ProtocolError("env_indices", "an infer needs at least one env")
        for env in envs:
            if env in self.holding:
                raise ProtocolError("env_indices", f"env {env} still holds an action")
        reuse = np.zeros(n, dtype=bool)
        if "reuse" in message:
            reuse = _flags(message, "reuse", n)
        data_rows = state_rows(message.get("data"), int(n - reuse.sum()), "data")
        states = np.empty((n, data_rows.shape[1]))
        k = 0
        for row, env in enumerate(envs):
            if reuse[row]:
                if env not in self.last_obs or self.last_ended.get(env, True):
                    raise ProtocolError("reuse", f"env {env} has no non-terminal feedback on this connection to reuse")
                if self.last_obs[env].shape[0] != data_rows.shape[1]:
                    raise ProtocolError("data.states", "the reused and the sent states differ in width")
                states[row] = self.last_obs[env]
            else:
                states[row] = data_rows[k]
                k += 1
        actions, z, noise = self.learner.act(states)
        for row, env in enumerate(envs):
            episode = self.episodes.setdefault(env, [])
            if step_ids[row] == 0 and episode:
                # a new episode whose predecessor never reported its end: forget it
                episode.clear()
            previous = episode[-1].reward if episode else None
            chunk = _Chunk(z[row], noise[row], step_ids[row], previous)
            self.holding[env] = chunk
        chunk_array = np.repeat(actions[None, :, :], self.horizon, axis=0).astype("<f4")
        self.expect = FEEDBACK
        return packb(
            {"message_type": ACTION, "data": {"env_ids": np.asarray(envs, dtype="<i8"), "action": chunk_array}}
        )

    def _feedback(self, message: dict) -> list[tuple[int, float, int]]:
        envs = _indices(message, "env_indices")
        m = len(envs)
        if m == 0:
            raise ProtocolError("env_indices", "a feedback needs at least one env")
        data = message.get("data")
        if not isinstance(data, dict):
            raise ProtocolError("data", "must be a map")
        rewards = data.get("rewards")
        if not isinstance(rewards, np.ndarray) or rewards.shape != (m,) or rewards.dtype.kind != "f":
            raise ProtocolError("rewards", f"must be a float array of shape [{m}]")
        rewards = rewards.astype(np.float64)
        if not np.isfinite(rewards).all():
            raise ProtocolError("rewards", "holds NaN or infinite values")
        ended = _flags(data, "terminated", m) | _flags(data, "truncated", m)
        obs = state_rows(data.get("obs"), m, "obs")
        info = _episode_info(data.get("info"), m)
        for env in envs:
            if env not in self.holding:
                raise ProtocolError("env_indices", f"env {env} holds no action")
        finished = []
        for row, env in enumerate(envs):
            chunk = self.holding.pop(env)
            chunk.reward = float(rewards[row])
            episode = self.episodes.setdefault(env, [])
            episode.append(chunk)
            self.last_obs[env] = obs[row]
            self.last_ended[env] = bool(ended[row])
            if not ended[row]:
                continue
            complete = episode[0].step_id == 0
            if info is not None and info[0][row]:
                finished.append((env, float(info[1][row]), int(info[2][row])))
            elif complete:
                finished.append((env, sum(c.reward for c in episode), 0))
            self.learner.episode_done(list(episode))
            episode.clear()
        self.expect = INFER
        return finished


def _step_ids(message: Mapping, key: str, n: int) -> list[int]:
    value = message.get(key)
    if not isinstance(value, np.ndarray) or value.shape != (n,) or value.dtype.kind not in "iu":
        raise ProtocolError(key, f"must be an int array of shape [{n}]")
    return [int(v) for v in value.tolist()]


# -- the server -------------------------------------------------------------------------


class DemoTrainer:
    """The websocket server around one :class:`PolicyGradient`, shared by every connection."""

    def __init__(self, settings: DemoTrainerSettings) -> None:
        self.settings = settings
        self.learner = PolicyGradient(settings)
        self._metadata_frame = packb(
            {
                "message_type": METADATA,
                "data": {
                    "protocol_version": 1,
                    "server": SERVER_NAME,
                    "server_version": "0.1.0",
                    "algorithm": ALGORITHM,
                    "policy": "linear-gaussian",
                    "action_horizon": settings.horizon,
                    "action_dim": settings.action_dim,
                    "features": [REUSE_FEEDBACK_OBS],
                },
            }
        )
        self._server: Server | None = None
        self._connections: set[ServerConnection] = set()
        self._lock = threading.Lock()  # guards what other threads read: records and counters
        self._records: list[EpisodeRecord] = []
        self._recent: deque[float] = deque(maxlen=RECENT_EPISODES)
        self._chunks = 0
        self._started_at: float | None = None
        self._ended_at: float | None = None
        self._over: asyncio.Event | None = None
        self._timer: asyncio.Future | None = None  # ends the run after the duration
        self._ended = False

    # -- what other threads may read ----------------------------------------------

    def stats(self) -> TrainerStats:
        with self._lock:
            recent = sum(self._recent) / len(self._recent) if self._recent else None
            if self._started_at is None:
                elapsed = 0.0
            else:
                elapsed = (self._ended_at or time.monotonic()) - self._started_at
            return TrainerStats(
                connected=len(self._connections),
                elapsed_s=elapsed,
                chunks=self._chunks,
                episodes=len(self._records),
                recent_mean_return=recent,
                updates=self.learner.updates,
                policy_std=float(self.learner.std.mean()),
                finished=self._ended,
            )

    def records(self) -> list[EpisodeRecord]:
        with self._lock:
            return list(self._records)

    # -- running ----------------------------------------------------------------

    async def start(self) -> int:
        """Start listening; the port (useful with port 0)."""
        self._over = asyncio.Event()
        self._server = await serve_trainer(
            self._handle, self.settings.host, self.settings.port, close_timeout=_CLOSE_TIMEOUT_S
        )
        return next(iter(self._server.sockets)).getsockname()[1]

    async def run_until_done(self) -> None:
        """Serve until the duration has passed since the first connection (or :meth:`end` was called)."""
        assert self._over is not None and self._server is not None, "call start() first"
        await self._over.wait()
        with self._lock:
            self._ended_at = time.monotonic()
        for ws in list(self._connections):
            await ws.close(1001, STOP_REASON)
        self._server.close()
        await self._server.wait_closed()
        with self._lock:
            self._ended = True

    def end(self) -> None:
        """End the run now (from the event loop's thread)."""
        if self._over is not None:
            self._over.set()

    async def _end_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        log.info("the run's %g s are over; ending it", self.settings.duration_s)
        self.end()

    async def _handle(self, ws: ServerConnection) -> None:
        assert self._over is not None
        if self._over.is_set():
            await ws.close(1001, STOP_REASON)
            return
        with self._lock:
            if self._started_at is None:
                self._started_at = time.monotonic()
                self._timer = asyncio.ensure_future(self._end_after(self.settings.duration_s))
            self._connections.add(ws)
        log.info("client connected from %s", ws.remote_address)
        session = Session(self.learner, self.settings.horizon)
        try:
            await ws.send(self._metadata_frame)
            await self._serve(ws, session)
        except ConnectionClosed as exc:
            log.info("client left: %s", exc)
        finally:
            with self._lock:
                self._connections.discard(ws)

    async def _serve(self, ws: ServerConnection, session: Session) -> None:
        while True:
            timeout = self.settings.feedback_timeout_s if session.expect == FEEDBACK else None
            try:
                frame = await asyncio.wait_for(ws.recv(), timeout)
            except asyncio.TimeoutError:
                log.warning("no feedback for %g s; closing", self.settings.feedback_timeout_s)
                await ws.close(1001, FEEDBACK_TIMEOUT_REASON)
                return
            try:
                if isinstance(frame, str):
                    raise ProtocolError("frame", "a text frame; PlugRL messages are binary")
                reply, finished = session.receive(unpackb(frame))
            except (ProtocolError, ValueError) as exc:
                # as a PlugRL server does: forget this connection's state and let the client start over
                log.warning("protocol error from the client: %s; asking it to resync", exc)
                await ws.close(1001, RESYNC_REASON)
                return
            if reply is not None:
                await ws.send(reply)
                with self._lock:
                    self._chunks += 1
            if finished:
                self._record(finished)

    def _record(self, finished: Sequence[tuple[int, float, int]]) -> None:
        with self._lock:
            now = 0.0 if self._started_at is None else time.monotonic() - self._started_at
            for env, ret, length in finished:
                self._records.append(EpisodeRecord(now, env, ret, length))
                self._recent.append(ret)


async def serve_run(settings: DemoTrainerSettings, trainer: DemoTrainer | None = None) -> DemoTrainer:
    """Serve one whole run; the trainer, for its records."""
    trainer = trainer or DemoTrainer(settings)
    await trainer.start()
    await trainer.run_until_done()
    return trainer


class TrainerThread:
    """The demo trainer on its own event loop thread, for a process that does other things meanwhile."""

    def __init__(self, settings: DemoTrainerSettings) -> None:
        self.trainer = DemoTrainer(settings)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._port: int | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="plugrl-demo-trainer", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._port = await self.trainer.start()
            self._ready.set()
            await self.trainer.run_until_done()

        try:
            asyncio.run(main())
        except BaseException as exc:  # hand any failure to the thread that started this one
            self.error = exc
        finally:
            self._ready.set()

    def start(self, timeout: float = 10.0) -> int:
        """Start serving; the port it listens on."""
        self._thread.start()
        self._ready.wait(timeout)
        if self._port is None:
            raise RuntimeError(f"the demo trainer did not start: {self.error!r}")
        return self._port

    def end(self) -> None:
        """End the run now: clients get plugrl-server-stop."""
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.trainer.end)

    def join(self, timeout: float) -> bool:
        """Wait for the thread; True if it finished."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


# -- command line -------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    d = DemoTrainerSettings()
    p = argparse.ArgumentParser(prog="plugrl-demo-trainer", description=__doc__.splitlines()[0])
    p.add_argument("--host", default=d.host, help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=d.port, help="port (default %(default)s; 0 picks a free one)")
    p.add_argument("--duration", type=float, default=d.duration_s, help="seconds from the first connection to the end")
    p.add_argument("--horizon", type=int, default=d.horizon, help="steps per action chunk (default %(default)s)")
    p.add_argument("--action-dim", type=int, default=d.action_dim)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--feedback-timeout",
        type=float,
        default=d.feedback_timeout_s,
        help="close a connection whose feedback is this late, as a PlugRL server does (default %(default)s s)",
    )
    p.add_argument("--output", default="", help="write returns.png, summary.json and episodes.csv here at the end")
    return p


async def _run_cli(settings: DemoTrainerSettings, trainer: DemoTrainer) -> None:
    port = await trainer.start()
    print(
        f"{SERVER_NAME} listening on ws://{settings.host}:{port}; the run lasts {settings.duration_s:g} s "
        "from the first connection",
        flush=True,
    )

    async def report() -> None:
        while True:
            await asyncio.sleep(10.0)
            s = trainer.stats()
            ret = "-" if s.recent_mean_return is None else f"{s.recent_mean_return:.2f}"
            print(
                f"{s.elapsed_s:5.0f} s | {s.connected} client(s) | {s.chunks} chunks | {s.episodes} episodes | "
                f"recent mean return {ret} | {s.updates} updates, noise {s.policy_std:.2f}",
                flush=True,
            )

    reporter = asyncio.ensure_future(report())
    try:
        await trainer.run_until_done()
    finally:
        reporter.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve one run, then print (and with --output, write) what was learned."""
    args = _parser().parse_args(rclpy_free_args(sys.argv[1:] if argv is None else argv))
    try:
        settings = DemoTrainerSettings(
            host=args.host,
            port=args.port,
            duration_s=args.duration,
            horizon=args.horizon,
            action_dim=args.action_dim,
            seed=args.seed,
            feedback_timeout_s=args.feedback_timeout,
        )
    except ValueError as exc:
        _parser().error(str(exc))
    # SIGINT (also when a shell started us with it ignored) and SIGTERM end the run, as Ctrl-C does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    logging.basicConfig(level=logging.INFO, format="[plugrl-demo-trainer] %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)  # one line per connection is ours to say
    trainer = DemoTrainer(settings)
    try:
        asyncio.run(_run_cli(settings, trainer))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    except OSError as exc:
        print(f"{SERVER_NAME}: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 2
    from plugrl_ros.demo.runner import summarize, write_results

    records = trainer.records()
    summary = summarize(records, trainer.stats().elapsed_s)
    print(json_line(summary), flush=True)
    if args.output:
        write_results(args.output, records, summary)
    return 0 if records else 1


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def rclpy_free_args(argv: Sequence[str]) -> list[str]:
    """The arguments before any ``--ros-args`` (launch passes some to every process it starts)."""
    argv = list(argv)
    return argv[: argv.index("--ros-args")] if "--ros-args" in argv else argv


def json_line(summary: Mapping[str, Any]) -> str:
    shown = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}
    return "summary: " + ", ".join(f"{k} {v}" for k, v in shown.items())


if __name__ == "__main__":
    sys.exit(main())
