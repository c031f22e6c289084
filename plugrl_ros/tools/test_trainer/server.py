"""The test trainer's server: it serves one client through a script of endings and checks everything it sends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from plugrl_ros.protocol.client import RESYNC_REASON, STOP_REASON
from plugrl_ros.protocol.codec import packb
from plugrl_ros.protocol.server_messages import build_metadata
from plugrl_ros.tools.serving import serve_trainer
from plugrl_ros.tools.test_trainer.clauses import (
    NO_EMPTY_CONNECTIONS,
    RECONNECTS,
    STOP_EXITS,
    TEXT_FATAL,
    WAITS_FOR_METADATA,
)
from plugrl_ros.tools.test_trainer.exchange import Exchange, close_text
from plugrl_ros.tools.test_trainer.report import Recorder, Report
from plugrl_ros.tools.test_trainer.settings import CLOSE_ENDINGS, RECONNECT_ENDINGS, TrainerSettings
from plugrl_ros.tools.test_trainer.wire_checks import check_compression, describe_frame, text_ending

log = logging.getLogger("plugrl_ros.test_trainer")

_ONE_MIB = 1 << 20
# A client speaking first, sending garbage, or losing its place in the
# exchange gets a resync, as a real trainer would give it; a client that does
# it on every connection would loop for ever, so the trainer gives up.
_MAX_CONSECUTIVE_ABORTS = 3
_CLOSE_TIMEOUT_S = 5.0


@dataclass(eq=False)  # identity: kept in a set until released
class _Link:
    """A client connection handed from the websockets handler to the script driver."""

    number: int
    ws: ServerConnection
    arrived: float
    done: asyncio.Future
    ending: bool = False  # the trainer has started to end it: a new connection now is a reconnect


@dataclass(frozen=True)
class _Outcome:
    kind: str  # "ended", "aborted", "gave-up" or "client-closed"
    how: str  # how the connection closed, for the report
    code: int | None = None


# What the driver waits for after a connection, and for how long.
_FIRST = "first"
_RECONNECT = "reconnect"  # the trainer asked the client to reconnect
_CLIENT_LEFT = "client-left"  # the client left in the middle of the script
_SERVE_LEFT = "serve-left"  # the client left during the final "serve" entry
_STOPPED = "stopped"
_TEXTED = "texted"


class TestTrainer:
    """A PlugRL server that serves one client through a script of endings and checks everything it sends."""

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, settings: TrainerSettings) -> None:
        self.settings = settings
        self._rec = Recorder()
        if settings.keep_transcript:
            self._rec.transcript = []
        metadata: dict[str, Any] = {"protocol_version": 1, "server": "plugrl-test-trainer"}
        if settings.announce_shape:
            metadata["action_horizon"] = settings.horizon
            metadata["action_dim"] = settings.action_dim
        metadata["features"] = list(settings.features)
        if settings.metadata_padding_bytes:
            metadata["padding"] = bytes(settings.metadata_padding_bytes)
        self._metadata = metadata
        self._metadata_frame = packb(build_metadata(metadata))
        self._server: Server | None = None
        self._driver: asyncio.Task | None = None
        self._arrivals: asyncio.Queue[_Link] | None = None
        self._current: _Link | None = None  # the newest connection handed to the driver and not yet finished
        self._links: set[_Link] = set()
        self._connections = 0
        self._aborts = 0
        self._over = False
        self._ended_early = False

    @property
    def report(self) -> Report:
        return self._rec.report(self.settings.script, self._connections)

    async def start(self) -> int:
        """Start listening; returns the port (useful with port 0)."""
        assert self._server is None, "start() was already called"
        self._arrivals = asyncio.Queue()
        self._server = await serve_trainer(
            self._handle,
            self.settings.host,
            self.settings.port,
            close_timeout=_CLOSE_TIMEOUT_S,
            access=self.settings.access,
            logger=log,
        )
        port = next(iter(self._server.sockets)).getsockname()[1]
        self._driver = asyncio.ensure_future(self._drive())
        return port

    async def finished(self, timeout: float | None = None) -> Report:
        """Wait for the script to end (and its grace period), close the server, return the report.

        On timeout the server is closed as well and ``asyncio.TimeoutError``
        is raised; :attr:`report` then holds what was seen so far.
        """
        assert self._driver is not None, "call start() first"
        try:
            await asyncio.wait_for(asyncio.shield(self._driver), timeout)
        except asyncio.TimeoutError:
            self._driver.cancel()
            await asyncio.gather(self._driver, return_exceptions=True)
            self._rec.incomplete = self._rec.incomplete or f"the run did not end within {timeout:g} s"
            raise
        except asyncio.CancelledError:
            if not self._ended_early:  # cancelled from outside, not by end()
                raise
        finally:
            await self._shutdown()
        return self.report

    def end(self) -> None:
        """End the run now (on the trainer's event loop): what was seen so far is the report."""
        if self._driver is not None and not self._driver.done():
            self._rec.incomplete = self._rec.incomplete or "the run was ended before its script finished"
            self._ended_early = True
            self._driver.cancel()

    async def _shutdown(self) -> None:
        self._over = True
        for link in list(self._links):
            self._release(link)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    # -- connections arrive ---------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        loop = asyncio.get_running_loop()
        self._connections += 1
        link = _Link(self._connections, ws, loop.time(), loop.create_future())
        if self._over:
            await ws.close(1001, STOP_REASON)
            return
        current = self._current
        # A connection the client is already closing counts as gone: its
        # reconnect may overtake the driver noticing the close.
        if current is not None and not current.ending and current.ws.protocol.state is State.OPEN:
            self._rec.fail(
                RECONNECTS,
                f"connection {link.number} opened while connection {current.number} was still open; "
                "the trainer serves one client at a time",
            )
            await ws.close(1013, "plugrl-test-trainer serves one client at a time")
            return
        self._current = link
        self._links.add(link)
        assert self._arrivals is not None
        self._arrivals.put_nowait(link)
        await link.done

    def _release(self, link: _Link) -> None:
        if not link.done.done():
            link.done.set_result(None)
        self._links.discard(link)
        if self._current is link:
            self._current = None

    async def _next_link(self, timeout: float | None) -> _Link | None:
        assert self._arrivals is not None
        try:
            return await asyncio.wait_for(self._arrivals.get(), timeout)
        except asyncio.TimeoutError:
            return None

    # -- the script -----------------------------------------------------------

    async def _drive(self) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        waits = {
            _FIRST: None,
            _RECONNECT: s.reconnect_window_s,
            _CLIENT_LEFT: s.reconnect_window_s,
            _SERVE_LEFT: s.grace_s,
            _STOPPED: s.grace_s,
            _TEXTED: s.grace_s,
        }
        entry = 0
        state = _FIRST
        previous: tuple[int, str] = (0, "")
        ended_at = loop.time()
        while True:
            link = await self._next_link(waits[state])
            if link is None:
                self._after_silence(state, previous, entry)
                return
            after = link.arrived - ended_at
            try:
                if state in (_STOPPED, _TEXTED):
                    clause, rule = (STOP_EXITS, "stop close") if state == _STOPPED else (TEXT_FATAL, "text frame")
                    self._rec.fail(
                        clause,
                        f"the client reconnected (connection {link.number}) {after:.2f} s after the {rule} "
                        f"of connection {previous[0]}",
                    )
                    await link.ws.close(1001, STOP_REASON)
                    return
                outcome = await self._serve(link, s.script[entry], after_server_close=state == _RECONNECT)
            finally:
                self._release(link)
            ended_at = loop.time()
            previous = (link.number, outcome.how)
            if outcome.kind == "ended":
                self._aborts = 0
                ending = s.script[entry]
                if ending in RECONNECT_ENDINGS:
                    entry += 1
                    state = _RECONNECT
                else:
                    state = _STOPPED if ending == "stop" else _TEXTED
            elif outcome.kind == "aborted":
                state = _RECONNECT
            elif outcome.kind == "gave-up":
                self._rec.incomplete = (
                    f"gave up after {_MAX_CONSECUTIVE_ABORTS} consecutive connections ended by protocol violations"
                )
                return
            elif s.script[entry] == "serve":
                if outcome.code != 1000:
                    self._rec.note(
                        f"the client closed connection {link.number} with {outcome.how}; "
                        "a client that stops should close with code 1000"
                    )
                state = _SERVE_LEFT
            else:
                self._rec.note(
                    f"the client closed connection {link.number} itself ({outcome.how}) "
                    f"before the trainer ended it with {s.script[entry]!r}"
                )
                state = _CLIENT_LEFT

    def _after_silence(self, state: str, previous: tuple[int, str], entry: int) -> None:
        """No new connection came while the driver waited after ``state``."""
        s = self.settings
        number, how = previous
        if state == _RECONNECT:
            self._rec.fail(
                RECONNECTS, f"no reconnect within {s.reconnect_window_s:g} s after connection {number} closed ({how})"
            )
            self._rec.incomplete = f"entries not run: {', '.join(s.script[entry:])}"
        elif state == _CLIENT_LEFT:
            self._rec.incomplete = (
                f"the client left connection {number} ({how}) and did not come back within "
                f"{s.reconnect_window_s:g} s; entries not run: {', '.join(s.script[entry:])}"
            )
        elif state == _STOPPED:
            self._rec.ok(STOP_EXITS)
        elif state == _TEXTED:
            self._rec.ok(TEXT_FATAL)

    async def _serve(self, link: _Link, ending: str, after_server_close: bool) -> _Outcome:
        s = self.settings
        ws = link.ws
        loop = asyncio.get_running_loop()
        check_compression(self._rec, link.number, link.ws)
        if s.metadata_delay_s > 0:
            try:
                early = await asyncio.wait_for(ws.recv(), s.metadata_delay_s)
            except asyncio.TimeoutError:
                self._rec.ok(WAITS_FOR_METADATA)
            except ConnectionClosed as exc:
                return self._client_closed(exc, None)
            else:
                self._rec.fail(
                    WAITS_FOR_METADATA,
                    f"connection {link.number}: the client sent {describe_frame(early)} "
                    f"{loop.time() - link.arrived:.2f} s after the handshake, before the metadata",
                )
                return await self._abort(link, "a frame before the metadata")
        try:
            await ws.send(self._metadata_frame)
        except ConnectionClosed as exc:
            return self._client_closed(exc, None)
        exchange = Exchange(
            link.number,
            s,
            self._rec,
            self._metadata,
            after_server_close,
            large_metadata=len(self._metadata_frame) > _ONE_MIB,
        )
        awaiting_feedback = False
        while True:
            bound = s.feedback_timeout_s if awaiting_feedback and s.feedback_timeout_s > 0 else None
            try:
                frame = await asyncio.wait_for(ws.recv(), bound)
            except ConnectionClosed as exc:
                if exchange.messages == 0 and ending != "serve" and _close_of(exc)[0] == 1000:
                    # (another code is a crash or a frame limit: judged as such, or noted)
                    self._rec.fail(
                        NO_EMPTY_CONNECTIONS,
                        f"connection {link.number}: the client closed it ({close_text(*_close_of(exc))}) after "
                        "the metadata, before any message, while the run went on (a client connects once)",
                    )
                return self._client_closed(exc, exchange)
            except asyncio.TimeoutError:
                return await self._feedback_timeout(link)
            if exchange.messages == 0:
                self._rec.ok(NO_EMPTY_CONNECTIONS)
            awaiting_feedback = False
            reply = exchange.receive(frame)
            if reply.abort is not None:
                return await self._abort(link, reply.abort)
            if reply.frame is None:
                continue
            try:
                await ws.send(reply.frame)
            except ConnectionClosed as exc:
                return self._client_closed(exc, exchange)
            awaiting_feedback = True  # only an infer is answered: an action went out
            # The ending comes right after an action, while the client holds
            # it: that is when a close or a crash hurts a client the most.
            if ending != "serve" and exchange.feedbacks >= s.feedbacks_per_connection:
                return await self._end(link, ending, exchange)

    async def _feedback_timeout(self, link: _Link) -> _Outcome:
        """As a PlugRL server does: a client silent after an action is closed, and expected back."""
        link.ending = True
        self._rec.note(
            f"connection {link.number}: no feedback within {self.settings.feedback_timeout_s:g} s of an action; "
            "closed it (1001 Feedback timeout)"
        )
        code, reason = CLOSE_ENDINGS["timeout"]
        await link.ws.close(code, reason)
        return _Outcome("aborted", close_text(code, reason))

    def _client_closed(self, exc: ConnectionClosed, exchange: Exchange | None) -> _Outcome:
        code, reason = _close_of(exc)
        if exchange is not None:
            exchange.client_closed(code, reason)
        return _Outcome("client-closed", close_text(code, reason), code)

    async def _abort(self, link: _Link, why: str) -> _Outcome:
        link.ending = True
        self._aborts += 1
        if self._aborts >= _MAX_CONSECUTIVE_ABORTS:
            await link.ws.close(1001, STOP_REASON)
            return _Outcome("gave-up", f"{close_text(1001, STOP_REASON)} after {why}")
        await link.ws.close(1001, RESYNC_REASON)
        return _Outcome("aborted", f"{close_text(1001, RESYNC_REASON)} after {why}")

    async def _end(self, link: _Link, ending: str, exchange: Exchange) -> _Outcome:
        link.ending = True
        if ending in CLOSE_ENDINGS:
            code, reason = CLOSE_ENDINGS[ending]
            await link.ws.close(code, reason)
            return _Outcome("ended", close_text(code, reason))
        if ending == "drop":
            # No close frame at all: what a crashed host or a cut cable looks like.
            link.ws.transport.abort()
            return _Outcome("ended", "dropped without a close frame")
        assert ending == "text", ending
        if not await text_ending(self._rec, link.number, link.ws, exchange, self.settings.grace_s):
            await link.ws.close(1001, STOP_REASON)
        return _Outcome("ended", "a text frame")


def _close_of(exc: ConnectionClosed) -> tuple[int | None, str]:
    """The code and reason of the client's close frame (None, "" if it sent none)."""
    return (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd is not None else (None, "")


async def run_trainer(settings: TrainerSettings, ready: Callable[[int], None] | None = None) -> Report:
    """Run the test trainer until its script ends; ``ready`` gets the port once it listens."""
    trainer = TestTrainer(settings)
    port = await trainer.start()
    if ready is not None:
        ready(port)
    return await trainer.finished()
