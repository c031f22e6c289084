"""``plugrl-demo-trainer``: the demo's small PlugRL trainer, a linear policy learning by policy gradient.

A fixture that learns for real, not a product: the learner is
:mod:`plugrl_ros.demo.policy_gradient`; this module serves it. Each
connection's protocol rules are :class:`TrainerConnection`'s, enforced as a
PlugRL server does (any broken rule closes that connection with
``plugrl-server-resync``, and the others go on). On top of them each
connection keeps what the learner needs: the states of each env's last
feedback (for the ``reuse-feedback-obs`` feature), the chunk each env holds,
and each env's chunks of the running episode; all of it is forgotten when the
connection closes. After ``duration_s`` (counted from the first connection) it
ends the run: close 1001 ``plugrl-server-stop``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ConnectionClosed

from plugrl_ros.demo.policy_gradient import Chunk, DemoTrainerSettings, PolicyGradient
from plugrl_ros.demo.results import EpisodeRecord, json_line, summarize, write_results
from plugrl_ros.protocol.client import RESYNC_REASON, STOP_REASON
from plugrl_ros.protocol.codec import packb
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.messages import REUSE_FEEDBACK_OBS
from plugrl_ros.protocol.server_messages import Feedback, Infer
from plugrl_ros.protocol.trainer_connection import ServerPhase, TrainerConnection
from plugrl_ros.tools.serving import TrainerThread, serve_trainer

__all__ = [
    "DemoTrainer",
    "DemoTrainerSettings",
    "EpisodeRecord",
    "PolicyGradient",
    "Session",
    "TrainerStats",
    "TrainerThread",
]

log = logging.getLogger("plugrl_ros.demo.trainer")

SERVER_NAME = "plugrl-demo-trainer"
ALGORITHM = "chunk-level policy gradient (REINFORCE, fitted baseline, Adam) on a linear-Gaussian policy"
FEEDBACK_TIMEOUT_REASON = "Feedback timeout"
RECENT_EPISODES = 20  # "recent mean return" is over this many episodes
_CLOSE_TIMEOUT_S = 5.0


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


# -- one connection's exchange, without I/O ----------------------------------------------


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
        info = _episode_info(feedback.info, m)
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
            if info is not None and info[0][row]:
                finished.append((env, float(info[1][row]), int(info[2][row])))
            elif complete:
                finished.append((env, sum(c.reward for c in episode), 0))
            self.learner.episode_done(list(episode))
            episode.clear()
        return finished


# -- the server -------------------------------------------------------------------------


class DemoTrainer:
    """The websocket server around one :class:`PolicyGradient`, shared by every connection."""

    def __init__(self, settings: DemoTrainerSettings) -> None:
        self.settings = settings
        self.learner = PolicyGradient(settings)
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

    async def finished(self) -> list[EpisodeRecord]:
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
        return self.records()

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
            await ws.send(session.metadata())
            await self._serve(ws, session)
        except ConnectionClosed as exc:
            log.info("client left: %s", exc)
        finally:
            with self._lock:
                self._connections.discard(ws)

    async def _serve(self, ws: ServerConnection, session: Session) -> None:
        while True:
            timeout = self.settings.feedback_timeout_s if session.awaiting_feedback else None
            try:
                frame = await asyncio.wait_for(ws.recv(), timeout)
            except asyncio.TimeoutError:
                log.warning("no feedback for %g s; closing", self.settings.feedback_timeout_s)
                await ws.close(1001, FEEDBACK_TIMEOUT_REASON)
                return
            try:
                reply, finished = session.receive(frame)
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
    await trainer.finished()
    return trainer


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
        await trainer.finished()
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


if __name__ == "__main__":
    sys.exit(main())
