"""A trainer's websocket server: bridges connect here, on a thread and event loop of its own.

Every trainer face of the package stands on it: RLlib's EnvRunner
(:mod:`plugrl_ros.rllib.env_runner`) and the Gymnasium vector env
(:mod:`plugrl_ros.vector`). Each connection runs on the package's server-side protocol core,
:class:`~plugrl_ros.protocol.trainer_connection.TrainerConnection`, exactly
as the demo trainer's do: metadata first, strict alternation, an env in a
feedback only while it holds an action, ``reuse-feedback-obs`` offered, an
``info`` that splits per env. Observations are read into the runner's
observation space here too (:mod:`plugrl_ros.serve.observations`), so a
broken rule or a frame unlike the declared spaces closes that connection with
``plugrl-server-resync`` before anything reaches an episode, and the other
bridges go on. Checked messages become events that the runner handles right
here, on this thread (``on_event``): an infer answered at once goes out without
leaving the thread; one the runner answers later (on-policy timing, after the
learner's update) comes back through its :class:`Answer`. A connection whose
feedback is later than ``feedback_timeout_s`` after an action is closed
(``Feedback timeout``), and :meth:`BridgeServer.stop` ends the run for every
bridge with ``plugrl-server-stop``.

While an infer waits for its answer (with on-policy timing, through the
learner's update) nothing is read from that connection; no keepalive pings
are sent, so a busy learner never closes a healthy link.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ConnectionClosed

from plugrl_ros.protocol.client import RESYNC_REASON, STOP_REASON
from plugrl_ros.protocol.codec import packb
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.server_auth import ServerAccess
from plugrl_ros.protocol.server_messages import Feedback, Infer, episode_counts
from plugrl_ros.protocol.trainer_connection import ServerPhase, TrainerConnection
from plugrl_ros.serve.events import Answer, Closed, Connected, Event, FedBack, Inferred
from plugrl_ros.serve.interventions import intervention_rows
from plugrl_ros.serve.link_figures import LinkFigures
from plugrl_ros.serve.observations import ObservationReader
from plugrl_ros.tools.serving import TrainerThread, serve_trainer

log = logging.getLogger("plugrl_ros.serve.bridge_server")

FEEDBACK_TIMEOUT_REASON = "Feedback timeout"
_CLOSE_TIMEOUT_S = 5.0


class BridgeServer:
    """Serves PlugRL to bridges on its own thread; hands checked events to ``on_event``, on that thread."""

    def __init__(
        self,
        host: str,
        port: int,
        reader: ObservationReader,
        metadata: Mapping[str, Any],
        on_event: Callable[[Event], None],
        figures: LinkFigures,
        feedback_timeout_s: float,
        *,
        access: ServerAccess | None,
        thread_name: str,
    ) -> None:
        """``access``: who may connect (required, as for :func:`serve_trainer`: None only in a test fixture)."""
        self.host = host
        self.access = access
        self.reader = reader
        self.metadata = dict(metadata)
        self.on_event = on_event  # never raises: a failure is the runner's to log and resync
        self.figures = figures
        self.feedback_timeout_s = feedback_timeout_s
        self._requested_port = port
        self._links = itertools.count()
        self._connections: dict[int, ServerConnection] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Server | None = None
        self._stopping: asyncio.Event | None = None
        # the package's trainer thread runs this server as it runs the demo and test trainers
        self._thread: TrainerThread[None] = TrainerThread(self, name=thread_name)

    # -- from the runner's thread --------------------------------------------------

    def listen(self, timeout: float = 10.0) -> int:
        """Listen on its own thread; the port (OSError if the address cannot be bound)."""
        return self._thread.start(timeout)

    @property
    def port(self) -> int:
        return self._thread.port

    @property
    def listening(self) -> bool:
        return self._thread.alive and self._thread.error is None

    @property
    def failure(self) -> BaseException | None:
        """Why the server thread stopped, if it failed."""
        return self._thread.error

    def close_link(self, link: int) -> None:
        """Close connection ``link`` for a resync (from any thread; nothing happens if it is gone)."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._resync(link)))
        except RuntimeError:
            if not loop.is_closed():  # the only RuntimeError expected here: the server has stopped
                raise

    def stop(self, timeout: float = 10.0) -> None:
        """End the run: every bridge is closed with ``plugrl-server-stop``, then the server and its thread stop."""
        self._thread.end()
        if not self._thread.join(timeout):
            log.warning("the bridge server did not stop within %g s", timeout)
        elif self._thread.error is not None:
            log.error("the bridge server had failed: %s", self._thread.error)

    # -- the Trainer that TrainerThread runs, on its event loop ----------------------

    async def start(self) -> int:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._server = await serve_trainer(
            self._handle, self.host, self._requested_port, _CLOSE_TIMEOUT_S, access=self.access, logger=log
        )
        return next(iter(self._server.sockets)).getsockname()[1]

    async def finished(self) -> None:
        assert self._stopping is not None and self._server is not None
        await self._stopping.wait()
        await asyncio.gather(*(ws.close(1001, STOP_REASON) for ws in list(self._connections.values())))
        self._server.close()
        await self._server.wait_closed()

    def end(self) -> None:
        assert self._stopping is not None
        self._stopping.set()

    async def _handle(self, ws: ServerConnection) -> None:
        assert self._stopping is not None
        if self._stopping.is_set():
            await ws.close(1001, STOP_REASON)
            return
        link = next(self._links)
        self._connections[link] = ws
        self.figures.opened(link)
        self.on_event(Connected(link, _address(ws.remote_address)))
        log.info("bridge %d connected from %s", link, ws.remote_address)
        connection = TrainerConnection(strict=True)
        try:
            await ws.send(packb(connection.send_metadata(self.metadata)))
            await self._serve(ws, link, connection)
        except ConnectionClosed as exc:
            log.info("bridge %d left: %s", link, exc)
        finally:
            self._connections.pop(link, None)
            self.figures.closed(link)
            self.on_event(Closed(link))

    async def _resync(self, link: int) -> None:
        ws = self._connections.get(link)
        if ws is not None:
            await ws.close(1001, RESYNC_REASON)

    async def _serve(self, ws: ServerConnection, link: int, connection: TrainerConnection) -> None:
        # one task for the connection's whole life, not one per infer: an answer is awaited at every env step
        closed = asyncio.ensure_future(ws.wait_closed())
        try:
            while True:
                awaiting_feedback = connection.phase is ServerPhase.AWAIT_FEEDBACK
                try:
                    # asyncio.timeout, not wait_for: no task of its own for every frame read
                    async with asyncio.timeout(self.feedback_timeout_s if awaiting_feedback else None):
                        frame = await ws.recv()
                except TimeoutError:
                    log.warning("bridge %d: no feedback for %g s; closing", link, self.feedback_timeout_s)
                    await ws.close(1001, FEEDBACK_TIMEOUT_REASON)
                    return
                read_at = time.monotonic()
                try:
                    message = connection.receive(frame)
                    event = self._event(link, message, read_at)
                except ProtocolError as exc:
                    # as a PlugRL server does: forget this connection's state and let the bridge start over
                    log.warning("bridge %d: %s; asking it to resync", link, exc)
                    connection.close()
                    await ws.close(1001, RESYNC_REASON)
                    return
                if isinstance(event, FedBack):
                    self.on_event(event)
                    continue
                self.figures.infer_read(link, event.envs, read_at)
                self.on_event(event)
                chunk = await _answer_or_close(event.answer, closed)
                if chunk is None:
                    return
                await ws.send(packb(connection.answer(chunk)))
                self.figures.answer_sent(link, event.envs, read_at)
        finally:
            closed.cancel()

    def _event(self, link: int, message: Infer | Feedback, read_at: float) -> Inferred | FedBack:
        if isinstance(message, Infer):
            sent = [
                env for env, reused in zip(message.env_indices, message.reuse or itertools.repeat(False)) if not reused
            ]
            rows = self.reader.rows(message.observation.data, len(sent), "data")
            assert self._loop is not None
            return Inferred(link, message.env_indices, dict(zip(sent, rows)), Answer(self._loop), read_at)
        # a strict connection hands on only usable arrays
        assert message.rewards is not None and message.terminated is not None and message.truncated is not None
        m = len(message.env_indices)
        return FedBack(
            link,
            message.env_indices,
            self.reader.rows(message.observation.data, m, "obs"),
            message.rewards,
            message.terminated,
            message.truncated,
            episode_counts(message.info, message.terminated | message.truncated),
            intervention_rows(message.info, m, int(self.metadata["action_horizon"]), int(self.metadata["action_dim"])),
        )


def _address(remote: object) -> str:
    """A peer's address as ``host:port`` (``[host]:port`` for IPv6)."""
    if isinstance(remote, tuple) and len(remote) >= 2:
        host, port = remote[0], remote[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(remote)


async def _answer_or_close(answer: Answer, closed: asyncio.Future) -> np.ndarray | None:
    """The answer, or None if the bridge went away (``closed``: its ``wait_closed``) while it was computed."""
    if not answer.future.done():
        await asyncio.wait({answer.future, closed}, return_when=asyncio.FIRST_COMPLETED)
    if answer.future.done():
        return answer.future.result()
    answer.future.cancel()
    return None
