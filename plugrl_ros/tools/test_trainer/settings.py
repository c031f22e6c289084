"""The test trainer's settings: what it announces, how each connection of its script ends, how long it watches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from plugrl_ros.protocol.client import RESYNC_REASON, STOP_REASON
from plugrl_ros.protocol.server_auth import DEFAULT_API_KEY_ENV, ServerAccess

# Endings that close with a code and reason, as the PlugRL server does (docs/protocol.md, Closing).
CLOSE_ENDINGS: dict[str, tuple[int, str]] = {
    "resync": (1001, RESYNC_REASON),
    "timeout": (1001, "Feedback timeout"),
    "crash": (1011, "Internal server error."),
    "stop": (1001, STOP_REASON),
}
RECONNECT_ENDINGS = ("resync", "timeout", "crash", "drop")
FINAL_ENDINGS = ("stop", "text", "serve")
ENDINGS = RECONNECT_ENDINGS + FINAL_ENDINGS


@dataclass(frozen=True)
class TrainerSettings:
    """What the test trainer announces, how each connection ends, and how long it watches."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0 = pick a free port
    script: tuple[str, ...] = ("resync", "stop")  # one entry per connection: how that connection ends
    feedbacks_per_connection: int = 20  # feedbacks received on a connection before its ending is triggered
    horizon: int = 4  # H of every action chunk
    action_dim: int = 2  # d
    action_dtype: str = "<f4"  # or "<f8"
    features: tuple[str, ...] = ()  # announced in the metadata's "features"
    announce_shape: bool = True  # put action_horizon / action_dim in the metadata
    metadata_delay_s: float = 0.3  # silence expected from the client before the metadata is sent (0: unchecked)
    metadata_padding_bytes: int = 1_100_000  # an extra metadata key the client must ignore; > 1 MiB frame
    probe: bool = True  # the client runs the probe environment: check its semantics
    grace_s: float = 1.5  # after the final ending: how long to watch for forbidden frames / reconnects
    n_envs: int | None = None  # if set, env indices must be < n_envs
    reconnect_window_s: float = 15.0  # how long a client may take to reconnect after a close that asks it to
    # as a PlugRL server: no feedback this long after an action closes the connection (1001 "Feedback
    # timeout") and the client is expected back; 0 = wait for ever (the scripted "timeout" ending is separate)
    feedback_timeout_s: float = 0.0
    tls_cert: str = ""  # PEM certificate chain: serve wss:// (with tls_key)
    tls_key: str = ""
    api_key_env: str = DEFAULT_API_KEY_ENV  # the variable holding the key clients must send (docs/security.md)
    # keep every message received and every action sent (the report's transcript): for tests that
    # compare what the trainer saw with what a client recorded; off by default, a long run's memory grows
    keep_transcript: bool = False

    @property
    def scheme(self) -> str:
        return self.access.scheme

    @property
    def access(self) -> ServerAccess:
        return ServerAccess(api_key_env=self.api_key_env, tls_cert=self.tls_cert, tls_key=self.tls_key)

    def __post_init__(self) -> None:
        object.__setattr__(self, "script", tuple(self.script))
        object.__setattr__(self, "features", tuple(self.features))
        if not self.script:
            raise ValueError("script: give at least one entry, the last being one of " + ", ".join(FINAL_ENDINGS))
        for i, entry in enumerate(self.script):
            if entry not in ENDINGS:
                raise ValueError(f"script[{i}]: {entry!r} is not one of {', '.join(ENDINGS)}")
        for i, entry in enumerate(self.script[:-1]):
            if entry in FINAL_ENDINGS:
                raise ValueError(f"script[{i}]: {entry!r} ends the run, so it can only be the last entry")
        if self.script[-1] not in FINAL_ENDINGS:
            raise ValueError(
                f"script[{len(self.script) - 1}]: the last entry must end the run ({', '.join(FINAL_ENDINGS)}), "
                f"got {self.script[-1]!r}"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is not in 0..65535")
        for name in ("feedbacks_per_connection", "metadata_padding_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: {getattr(self, name)} must not be negative")
        for name in ("horizon", "action_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: {getattr(self, name)} must be at least 1")
        if self.action_dtype not in ("<f4", "<f8"):
            raise ValueError(f"action_dtype: {self.action_dtype!r} is not '<f4' or '<f8'")
        for name in ("metadata_delay_s", "grace_s", "reconnect_window_s", "feedback_timeout_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: {getattr(self, name)} must be a non-negative number of seconds")
        if self.n_envs is not None and self.n_envs < 1:
            raise ValueError(f"n_envs: {self.n_envs} must be at least 1 (or None for no limit)")


def probe_episode_length(env: int) -> int:
    """L_i of the probe environment: env i terminates when t reaches 3 + 2 * (i % 3).

    Written here rather than imported from the probe client's code: a checker
    that shared its rules with the client under test would share its bugs.
    """
    return 3 + 2 * (env % 3)


def action_chunk(env_indices: Sequence[int], horizon: int, action_dim: int, dtype: str) -> np.ndarray:
    """The chunk answering an infer: ``action[k, row, j] = 10000*k + 10*env_indices[row] + j``.

    Every value names its step, env and dimension, so the probe's ``a`` state in
    a feedback shows which element the client applied last.
    """
    k = np.arange(horizon, dtype=np.float64)[:, None, None]
    envs = np.asarray(env_indices, dtype=np.float64).reshape(1, len(env_indices), 1)
    j = np.arange(action_dim, dtype=np.float64)[None, None, :]
    return (10000.0 * k + 10.0 * envs + j).astype(dtype)
