"""One connection of the demo trainer, without I/O: the protocol's rules, then what the learner needs.

Each connection's protocol rules are :class:`TrainerConnection`'s, enforced as
a PlugRL server does (any broken rule raises, and the server closes that
connection with ``plugrl-server-resync``). On top of them a session keeps what
the learner needs: the states of each env's last feedback (for the
``reuse-feedback-obs`` feature), the chunk each env holds, and each env's
chunks of the running episode; all of it goes with the connection.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plugrl_ros.demo.policy_gradient import Chunk, PolicyGradient
from plugrl_ros.protocol.codec import packb
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.messages import REUSE_FEEDBACK_OBS
from plugrl_ros.protocol.server_messages import Feedback, Infer, episode_counts
from plugrl_ros.protocol.trainer_connection import ServerPhase, TrainerConnection

SERVER_NAME = "plugrl-demo-trainer"
ALGORITHM = "chunk-level policy gradient (REINFORCE, fitted baseline, Adam) on a linear-Gaussian policy"


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


METADATA: dict[str, Any] = {
    "protocol_version": 1,
    "server": SERVER_NAME,
    "server_version": "0.1.0",
    "algorithm": ALGORITHM,
    "policy": "linear-gaussian",
    "features": [REUSE_FEEDBACK_OBS],
}


class Session:
    """What the trainer knows about one connection's envs; dropped, all of it, when the connection closes."""

    def __init__(self, learner: PolicyGradient, horizon: int) -> None:
        self.learner = learner
        self.horizon = horizon
        self.connection = TrainerConnection(strict=True)
        self.last_states: dict[int, np.ndarray] = {}  # the states of each env's last feedback
        self.holding: dict[int, Chunk] = {}  # envs with an action and no feedback yet
        self.episodes: dict[int, list[Chunk]] = {}  # each env's chunks of its running episode

    def metadata(self) -> bytes:
        """The metadata frame that opens the connection."""
        shape = {"action_horizon": self.horizon, "action_dim": self.learner.settings.action_dim}
        return packb(self.connection.send_metadata({**METADATA, **shape}))

    @property
    def awaiting_feedback(self) -> bool:
        return self.connection.phase is ServerPhase.AWAIT_FEEDBACK

    def receive(self, frame: bytes | str) -> tuple[bytes | None, list[tuple[int, float, int]]]:
        """One client frame: (the action frame to send or None, the episodes it ended as (env, return, length)).

        ProtocolError (a :class:`~plugrl_ros.protocol.server_messages.Resync`
        for a broken protocol rule) when the connection must resync.
        """
        message = self.connection.receive(frame)
        if isinstance(message, Infer):
            return self._infer(message), []
        return None, self._feedback(message)

    def _infer(self, infer: Infer) -> bytes:
        envs, reuse = infer.env_indices, infer.reuse or (False,) * len(infer.env_indices)
        data_rows = state_rows(infer.observation.data, infer.observation.rows or 0, "data")
        states = np.empty((len(envs), data_rows.shape[1]))
        k = 0
        for row, env in enumerate(envs):
            if reuse[row]:  # legal: the connection checked that env's last feedback was not terminal
                if self.last_states[env].shape[0] != data_rows.shape[1]:
                    raise ProtocolError("data.states", "the reused and the sent states differ in width")
                states[row] = self.last_states[env]
            else:
                states[row] = data_rows[k]
                k += 1
        actions, z, noise = self.learner.act(states)
        step_ids = infer.step_ids or (0,) * len(envs)
        for row, env in enumerate(envs):
            episode = self.episodes.setdefault(env, [])
            if step_ids[row] == 0 and episode:
                # a new episode whose predecessor never reported its end: forget it
                episode.clear()
            previous = episode[-1].reward if episode else None
            self.holding[env] = Chunk(z[row], noise[row], step_ids[row], previous)
        chunk_array = np.repeat(actions[None, :, :], self.horizon, axis=0).astype("<f4")
        return packb(self.connection.answer(chunk_array))

    def _feedback(self, feedback: Feedback) -> list[tuple[int, float, int]]:
        # a strict connection hands on only usable arrays
        assert feedback.rewards is not None and feedback.ended is not None
        m = len(feedback.env_indices)
        obs = state_rows(feedback.observation.data, m, "obs")
        counts = episode_counts(feedback.info, feedback.ended)
        ended = feedback.ended
        finished = []
        for row, env in enumerate(feedback.env_indices):
            chunk = self.holding.pop(env)
            chunk.reward = float(feedback.rewards[row])
            episode = self.episodes.setdefault(env, [])
            episode.append(chunk)
            self.last_states[env] = obs[row]
            if not ended[row]:
                continue
            complete = episode[0].step_id == 0
            count = counts[row]
            if count is not None:
                finished.append((env, count.ret, count.length))
            elif complete:
                finished.append((env, sum(c.reward for c in episode), 0))
            self.learner.episode_done(list(episode))
            episode.clear()
        return finished
