"""``plugrl-demo-trainer``: the demo's small PlugRL trainer, a linear policy learning by policy gradient.

A fixture that learns for real, not a product: the learner is
:mod:`plugrl_ros.demo.policy_gradient`, each connection a
:class:`~plugrl_ros.demo.session.Session` on the trainer-side protocol core;
this module serves them. A connection that breaks a protocol rule is closed
with ``plugrl-server-resync`` and the others go on. After ``duration_s``
(counted from the first connection) it ends the run: close 1001
``plugrl-server-stop``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ConnectionClosed

from plugrl_ros import stop_request
from plugrl_ros.demo.policy_gradient import DemoTrainerSettings, PolicyGradient
from plugrl_ros.demo.results import EpisodeRecord, json_line, summarize, write_results
from plugrl_ros.demo.session import SERVER_NAME, Session
from plugrl_ros.protocol.client import RESYNC_REASON, STOP_REASON
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.server_auth import AccessError, ServerAccess
from plugrl_ros.ros_args import without_ros_args
from plugrl_ros.tools.serving import TrainerThread, access_from, add_access_options, serve_trainer

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
    policy_std: float | None  # the exploration noise, when the learner has one number for it
    finished: bool


# -- the server -------------------------------------------------------------------------


class DemoTrainer:
    """The websocket server around one :class:`PolicyGradient`, shared by every connection."""

    def __init__(self, settings: DemoTrainerSettings, access: ServerAccess | None = None) -> None:
        self.settings = settings
        self.access = access  # None: no key, no TLS (the in-process demo, on loopback)
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
            self._handle,
            self.settings.host,
            self.settings.port,
            close_timeout=_CLOSE_TIMEOUT_S,
            access=self.access,
            logger=log,
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
    add_access_options(p)
    return p


async def _run_cli(settings: DemoTrainerSettings, trainer: DemoTrainer) -> None:
    port = await trainer.start()
    scheme = trainer.access.scheme if trainer.access is not None else "ws"
    print(
        f"{SERVER_NAME} listening on {scheme}://{settings.host}:{port}; the run lasts {settings.duration_s:g} s "
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
        # Ctrl-C and SIGTERM end the run as its duration does: clients get plugrl-server-stop.
        with stop_request.calling_in_loop(asyncio.get_running_loop(), trainer.end):
            await trainer.finished()
    finally:
        reporter.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve one run, then print (and with --output, write) what was learned."""
    args = _parser().parse_args(without_ros_args(sys.argv[1:] if argv is None else argv))
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
    stop_request.install()
    logging.basicConfig(level=logging.INFO, format="[plugrl-demo-trainer] %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)  # one line per connection is ours to say
    trainer = DemoTrainer(settings, access_from(args))
    try:
        asyncio.run(_run_cli(settings, trainer))
    except AccessError as exc:
        print(f"{SERVER_NAME}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{SERVER_NAME}: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 2
    records = trainer.records()
    summary = summarize(records, trainer.stats().elapsed_s)
    print(json_line(summary), flush=True)
    if args.output:
        write_results(args.output, records, summary)
    if stop_request.requested():
        print("interrupted: the run ended early", file=sys.stderr)
        return 0
    return 0 if records else 1


if __name__ == "__main__":
    sys.exit(main())
