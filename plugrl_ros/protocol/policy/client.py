"""The asyncio client of a policy server: one connection per robot, reconnecting, reporting events.

It moves frames; the contract's rules live in :class:`PolicySession`. The
transport is the trainer link's (:func:`plugrl_ros.protocol.client.connect_options`):
no compression, no frame-size cap, the optional ``Authorization: Api-Key``
header from an environment variable, ``wss://`` with a CA file, TCP keepalive
and ``TCP_USER_TIMEOUT`` (``tcp_timeout_s``). How long an answer may take is
judged by its consumer (deploy mode's runner), which aborts the
connection through :meth:`PolicyClient.abort`. What differs
is what a failure means: a policy server that raises sends its traceback as
a text frame and closes with 1011. That is not fatal here, as it is from a
trainer: the traceback is reported (it is the operator's only clue), and the
client reconnects with backoff, as after any lost connection.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from plugrl_ros.protocol.backoff import Backoff
from plugrl_ros.protocol.client import (
    CLOSE_NORMAL,
    CLOSE_PROTOCOL_ERROR,
    CONNECTION_FAULTS,
    ClientSettings,
    ConnectFailed,
    Notice,
    close_detail,
    close_frame,
    describe,
    open_connection,
    plain_link_warning,
    set_tcp_timeout,
)
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.policy.session import Chunk, Expectation, Phase, PolicySession, ServerMetadata

CLOSE_INTERNAL_ERROR = 1011  # what a policy server closes with after sending its traceback


@dataclass(frozen=True)
class PolicyConnected:
    """Connection ``epoch`` is open and its metadata arrived: requests may be sent."""

    epoch: int
    uri: str
    metadata: ServerMetadata


@dataclass(frozen=True)
class ChunkReceived:
    """A valid answer to the request sent with ``tag``."""

    epoch: int
    tag: Any
    chunk: Chunk
    round_trip_s: float


@dataclass(frozen=True)
class AnswerRejected:
    """The answer to the request sent with ``tag`` broke the contract; it yields no action."""

    epoch: int
    tag: Any
    detail: str


@dataclass(frozen=True)
class ServerTraceback:
    """The server failed and sent its traceback as a text frame (a close with 1011 follows)."""

    epoch: int
    text: str


@dataclass(frozen=True)
class PolicyDisconnected:
    """Connection ``epoch`` ended; an outstanding request on it will never be answered."""

    epoch: int
    detail: str
    code: int | None


PolicyEvent = PolicyConnected | ChunkReceived | AnswerRejected | ServerTraceback | PolicyDisconnected
Event = PolicyEvent | ConnectFailed | Notice

_STOP = object()


class PolicyClient:
    """Connects to one policy server and keeps connecting until :meth:`stop`.

    All methods must be called on the event loop running :meth:`run`;
    ``emit`` receives the events there and must not block.
    """

    def __init__(
        self,
        settings: ClientSettings,
        expect: Expectation,
        emit: Callable[[Event], None],
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._expect = expect
        self._emit = emit
        self._clock = clock
        self._backoff = Backoff(settings.reconnect_initial_s, settings.reconnect_max_s, rng)
        self._epoch = 0
        self._session: PolicySession | None = None
        self._commands: asyncio.Queue[Any] = asyncio.Queue()
        self._stopping = asyncio.Event()
        self._abort_detail: str | None = None
        self._tag: Any = None
        self._sent_at = 0.0

    @property
    def epoch(self) -> int:
        return self._epoch

    # -- the consumer's commands ---------------------------------------------

    def request(self, epoch: int, observation: Mapping[str, Any], tag: Any = None) -> bool:
        """Send one observation on connection ``epoch``; False (nothing sent) if that connection is gone.

        ``tag`` comes back with the answer. Only one request may be
        outstanding: a second one before the answer is a ProtocolMisuse.
        """
        session = self._session
        if epoch != self._epoch or session is None or session.phase is Phase.CLOSED or self._abort_detail:
            return False
        frame = session.request(observation)  # raises ProtocolMisuse before anything is queued
        self._tag = tag
        self._sent_at = self._clock()
        self._commands.put_nowait(frame)
        return True

    def abort(self, epoch: int, detail: str) -> None:
        """Close connection ``epoch`` (e.g. a request went unanswered too long) and reconnect with backoff."""
        if epoch == self._epoch and self._session is not None and self._abort_detail is None:
            self._abort_detail = detail
            self._commands.put_nowait(_STOP)

    def stop(self) -> None:
        """Close with 1000 and make :meth:`run` return."""
        self._stopping.set()
        self._commands.put_nowait(_STOP)

    # -- the loop ----------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, reconnect with backoff, until :meth:`stop`."""
        warning = plain_link_warning(self._settings, os.environ)
        if warning is not None:
            self._emit(Notice(warning))
        while not self._stopping.is_set():
            try:
                ws = await self._connect()
                if ws is None:
                    return
            except CONNECTION_FAULTS as exc:
                delay = self._backoff.next_delay()
                self._emit(ConnectFailed(describe(exc), delay))
                await self._sleep(delay)
                continue
            set_tcp_timeout(ws, self._settings.tcp_timeout_s)  # a server that vanished silently is noticed
            self._epoch += 1
            self._session = PolicySession(self._expect)
            self._abort_detail = None
            self._commands = asyncio.Queue()
            try:
                detail, code = await self._serve(ws)
            except CONNECTION_FAULTS as exc:
                # a connection may fail at any point (a reset while closing, a frame cut off): it is lost
                detail, code = f"{close_detail(ws)} ({describe(exc)})", None
            answered = self._session.answers > 0
            self._session.closed()
            self._emit(PolicyDisconnected(self._epoch, detail, code))
            if self._stopping.is_set():
                return
            if answered:
                self._backoff.reset()
            await self._sleep(self._backoff.next_delay())

    async def _connect(self) -> ClientConnection | None:
        """Open a connection, or None if :meth:`stop` came first (a hung handshake must not delay it)."""
        opening = asyncio.ensure_future(open_connection(self._settings))
        stopping = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({opening, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not opening.done():
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
            return None
        return opening.result()

    async def _serve(self, ws: ClientConnection) -> tuple[str, int | None]:
        """Move frames until the connection ends; how it ended, for the Disconnected event."""
        session = self._session
        assert session is not None
        epoch = self._epoch
        loop = asyncio.get_running_loop()
        # a server that accepts but never sends its metadata must not hold the robot forever
        metadata_deadline = loop.time() + self._settings.open_timeout_s
        reader = asyncio.ensure_future(ws.recv())
        command = asyncio.ensure_future(self._commands.get())
        try:
            while True:
                timeout = metadata_deadline - loop.time() if session.phase is Phase.AWAIT_METADATA else None
                done, _ = await asyncio.wait(
                    {reader, command},
                    timeout=max(timeout, 0.0) if timeout is not None else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not done:
                    await ws.close(CLOSE_NORMAL, "no metadata")
                    return f"the server sent no metadata within {self._settings.open_timeout_s:g} s", None
                if command in done:
                    item = command.result()
                    if item is _STOP:
                        if self._stopping.is_set():
                            await ws.close(CLOSE_NORMAL)
                            return "stopped", CLOSE_NORMAL
                        await ws.close(CLOSE_NORMAL, "request abandoned")
                        return f"closed by this client: {self._abort_detail}", CLOSE_NORMAL
                    try:
                        await ws.send(item)
                    except ConnectionClosed:
                        pass  # the reader sees the close and reports it
                    command = asyncio.ensure_future(self._commands.get())
                if reader not in done:
                    continue
                try:
                    frame = reader.result()
                except ConnectionClosed:
                    return close_detail(ws), close_frame(ws)[0]
                if isinstance(frame, str):
                    return await self._server_failed(ws, epoch, frame)
                outcome = self._receive(ws, session, epoch, frame)
                if outcome is not None:
                    await ws.close(CLOSE_PROTOCOL_ERROR, "protocol error")
                    return outcome, CLOSE_PROTOCOL_ERROR
                reader = asyncio.ensure_future(ws.recv())
        finally:
            for task in (reader, command):
                task.cancel()
            await asyncio.gather(reader, command, return_exceptions=True)

    def _receive(self, ws: ClientConnection, session: PolicySession, epoch: int, frame: bytes) -> str | None:
        """Hand one binary frame to the session and report it; a reason to close the connection, or None."""
        answering = session.phase is Phase.WAITING
        try:
            result = session.receive(frame)
        except ProtocolError as exc:
            if session.phase is Phase.CLOSED:
                return f"the server broke the contract: {exc}"
            self._emit(AnswerRejected(epoch, self._tag, str(exc)))
            return None
        if isinstance(result, ServerMetadata):
            self._emit(PolicyConnected(epoch, self._settings.uri, result))
        else:
            assert answering
            self._emit(ChunkReceived(epoch, self._tag, result, self._clock() - self._sent_at))
        return None

    async def _server_failed(self, ws: ClientConnection, epoch: int, text: str) -> tuple[str, int | None]:
        """A text frame: the server's traceback. Report it, and let the server's 1011 close the connection."""
        self._emit(ServerTraceback(epoch, text))
        await ws.close(CLOSE_NORMAL)  # completes the server's close handshake, or closes one that never comes
        code = close_frame(ws)[0]
        return f"the server failed ({close_detail(ws)})", code

    async def _sleep(self, delay: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        except asyncio.TimeoutError:
            pass
