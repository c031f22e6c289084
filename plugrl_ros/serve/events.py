"""What the websocket thread hands the EnvRunner: checked protocol events, in arrival order.

The websocket thread (:mod:`plugrl_ros.serve.bridge_server`) checks every frame
against the protocol and the observation space, then has the EnvRunner handle
one of these, on that thread. An infer carries an :class:`Answer` that the
EnvRunner fills with the action chunk, right away or later from the thread
that samples, and the websocket thread sends.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from plugrl_ros.protocol.server_messages import EpisodeCount
from plugrl_ros.serve.interventions import Intervened

Observation = dict[str, dict[str, np.ndarray]]  # one row: {"states": {...}, "images": {...}}


class Answer:
    """The action chunk for one infer, delivered from any thread to the connection's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """Made on ``loop``'s thread, as the infer is read."""
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self.future: asyncio.Future[np.ndarray] = loop.create_future()

    def deliver(self, chunk: np.ndarray) -> None:
        """Hand over the chunk ``[H, n, da]`` (thread-safe; nothing happens if the connection or the server is gone)."""
        if threading.get_ident() == self._loop_thread:
            self._set(chunk)  # answered as it was read: no wake-up of the loop needed
            return
        try:
            self._loop.call_soon_threadsafe(self._set, chunk)
        except RuntimeError:
            # the only RuntimeError call_soon_threadsafe raises: the server stopped (its loop is closed),
            # and with it the connection the chunk was for
            if not self._loop.is_closed():
                raise

    def _set(self, chunk: np.ndarray) -> None:
        if not self.future.done():
            self.future.set_result(chunk)


@dataclass(frozen=True)
class Connected:
    """A bridge connected; ``link`` names the connection for as long as it lasts."""

    link: int
    remote: str  # the bridge's address, host:port


@dataclass(frozen=True)
class Inferred:
    """An infer: these envs need an action; ``rows`` holds the observations sent (not those reused)."""

    link: int
    envs: tuple[int, ...]
    rows: dict[int, Observation]
    answer: Answer
    received_s: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class FedBack:
    """A feedback: one chunk's outcome per env (reward summed over the chunk, the observation after it)."""

    link: int
    envs: tuple[int, ...]
    observations: list[Observation]
    rewards: np.ndarray  # float64 [m]
    terminated: np.ndarray  # bool [m]
    truncated: np.ndarray  # bool [m]
    episodes: list[EpisodeCount | None]  # info["episode"] of each row that ended one, as the bridge counted it
    # info["intervention"] per row (None: the chunk's action ran on every step); None: not reported
    interventions: list[Intervened | None] | None = None


@dataclass(frozen=True)
class Closed:
    """The connection is gone, and with it every env state it had (the protocol's rule on every close)."""

    link: int


Event = Connected | Inferred | FedBack | Closed
