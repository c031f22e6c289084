"""The asyncio websocket client: moves frames, reconnects, and classifies closes.

It knows nothing of the protocol's message rules; those live in
:class:`plugrl_ros.protocol.connection.Connection`, driven by whoever
consumes this client's events. What belongs here is the transport as
docs/protocol.md describes it: no compression, no frame size cap, no keepalive ping
that could drop a healthy connection while the trainer is busy learning, the
optional API key header, TLS, what each kind of close means for
reconnecting, and noticing a link that died silently: an answer that does not
come within its bound, and TCP keepalive / ``TCP_USER_TIMEOUT`` where the
platform has them. Every connection gets an ``epoch``; a message queued for an
earlier epoch is dropped rather than sent, which is what keeps a feedback
from ever reaching a connection that did not send its action.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
import os
import random
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI, WebSocketException

from plugrl_ros.protocol.backoff import Backoff
from plugrl_ros.protocol.connection import Outgoing

STOP_REASON = "plugrl-server-stop"
RESYNC_REASON = "plugrl-server-resync"


CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_UNSUPPORTED_DATA = 1003


class CloseKind(enum.Enum):
    """Why a connection ended, which decides what happens next."""

    STOP = "run finished"  # plugrl-server-stop: exit, or wait for the next run
    RESYNC = "resync"  # plugrl-server-resync: reconnect at once
    LOST = "connection lost"  # anything else: reconnect with backoff
    FATAL = "fatal"  # a text frame: close, send nothing more, exit non-zero
    ABORTED = "aborted"  # we closed it: the trainer broke the protocol; reconnect with backoff
    CLIENT = "client stopped"  # we are stopping: close 1000


def classify_close(code: int | None, reason: str | None) -> CloseKind:
    """The meaning of a close the trainer initiated (docs/protocol.md, Closing)."""
    if reason == STOP_REASON:
        return CloseKind.STOP
    if reason == RESYNC_REASON:
        return CloseKind.RESYNC
    return CloseKind.LOST


@dataclass(frozen=True)
class ClientSettings:
    """How to reach the trainer. The API key itself is never stored here, only its variable's name."""

    uri: str = "ws://localhost:8000"
    api_key_env: str = ""
    ca_file: str = ""
    wait_for_next_run: bool = False
    reconnect_initial_s: float = 0.5
    reconnect_max_s: float = 10.0
    open_timeout_s: float = 10.0
    # how long a close waits for the trainer's close frame: a stalled link must not delay a shutdown
    close_timeout_s: float = 1.0
    max_frame_bytes: int | None = None  # the protocol allows frames of any size; a cap is the operator's choice
    # Dead-link bounds (0 = none). A silent partition or a half-open TCP connection (Wi-Fi roaming,
    # a NAT timeout) never closes by itself, and the protocol has no pings: the only sign is an
    # answer that does not come. The first answer on a connection (metadata, then the first
    # action) may be slow for good reasons (a model compiling), so it has a bound of its own.
    first_answer_timeout_s: float = 0.0
    answer_timeout_s: float = 0.0
    # TCP-level: keepalive probes and TCP_USER_TIMEOUT, so the kernel itself gives up on a
    # peer that stopped acknowledging (0 = the operating system's defaults, often 2 hours).
    tcp_timeout_s: float = 0.0

    def access_problem(self, environ: Mapping[str, str]) -> tuple[str, str, str] | None:
        """What would make every connection fail before it is tried: ``(setting, value, why)``, or None.

        An API-key variable that is named but not set, a CA file that does not
        load (only a ``wss://`` link uses one: a params file's ``ca_file`` must
        not stop a ``ws://`` test link). The key itself is never part of the answer.
        """
        if self.api_key_env:
            key = environ.get(self.api_key_env, "")
            if not key:
                why = f"the environment variable {self.api_key_env} is not set or empty"
                return "api_key_env", self.api_key_env, why
            padded = padded_key(self.api_key_env, key)
            if padded:
                return "api_key_env", self.api_key_env, padded
        if self.ca_file and self.uri.startswith("wss://"):
            try:
                ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                return "ca_file", self.ca_file, f"cannot load it as a CA bundle: {reason}"
        return None


def padded_key(variable: str, key: str) -> str:
    """Why ``key`` (from ``variable``) can never match, if it begins or ends with whitespace; else "".

    A key file read with its newline is the usual cause; the bridge and every
    server refuse to start with it rather than fail every handshake.
    """
    if key == key.strip():
        return ""
    return (
        f"the key in the environment variable {variable} begins or ends with whitespace (a newline from a key "
        "file?), so it would never match; strip it"
    )


# -- events the client reports to its consumer -------------------------------


@dataclass(frozen=True)
class Connected:
    epoch: int
    uri: str


@dataclass(frozen=True)
class FrameReceived:
    epoch: int
    frame: bytes


@dataclass(frozen=True)
class Disconnected:
    epoch: int
    kind: CloseKind
    detail: str


@dataclass(frozen=True)
class ConnectFailed:
    detail: str
    retry_in_s: float


@dataclass(frozen=True)
class Notice:
    text: str


Event = Connected | FrameReceived | Disconnected | ConnectFailed | Notice


class _RedactAuthorization(logging.Filter):
    """websockets logs handshake headers at DEBUG; the API key must never reach a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):
            return False
        return "authorization" not in text.lower()


def _library_logger() -> logging.Logger:
    return redacting_logger("plugrl_ros.websockets")


def redacting_logger(name: str) -> logging.Logger:
    """The logger ``name``, filtered so that no record mentioning an Authorization header passes."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _RedactAuthorization) for f in logger.filters):
        logger.addFilter(_RedactAuthorization())
    return logger


def is_loopback(uri: str) -> bool:
    host = urllib.parse.urlsplit(uri).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plain_link_warning(settings: ClientSettings, environ: Mapping[str, str]) -> str | None:
    """What to warn about once at startup for a plain ``ws://`` link to another host (None if nothing).

    With an API key the warning is louder: the key itself would cross the
    network in clear text, for anyone on it to read and reuse. It names the
    key's variable, never the key.
    """
    if not settings.uri.startswith("ws://") or is_loopback(settings.uri):
        return None
    if settings.api_key_env and environ.get(settings.api_key_env):
        return (
            f"{settings.uri} is plain ws:// to another host: the API key from ${settings.api_key_env} would be "
            "sent in clear text, readable (and reusable) by anyone on the network, and the link is unencrypted; "
            "serve wss:// and use a wss:// URI (docs/security.md)"
        )
    return (
        f"{settings.uri} is plain ws:// to another host: the link is unauthenticated and unencrypted; "
        "use wss:// with an API key, or a network you control (docs/security.md)"
    )


class TrainerClient:
    """Connects to the trainer and keeps connecting until the run ends or we stop.

    All methods must be called on the event loop running :meth:`run`.
    ``emit`` receives the events on that loop; it must not block.
    """

    def __init__(
        self, settings: ClientSettings, emit: Callable[[Event], None], rng: random.Random | None = None
    ) -> None:
        self._settings = settings
        self._emit = emit
        self._backoff = Backoff(settings.reconnect_initial_s, settings.reconnect_max_s, rng)
        self._epoch = 0
        self._ws: ClientConnection | None = None
        self._queue: asyncio.Queue[Outgoing | None] = asyncio.Queue()
        self._stopping = asyncio.Event()
        self._abort_detail: str | None = None
        self._abort_code = CLOSE_PROTOCOL_ERROR
        self._abort_retry_s: float | None = None  # the reconnect delay an abort asked for
        self._fatal_detail: str | None = None
        self._writer: asyncio.Future | None = None
        self._overdue: asyncio.TimerHandle | None = None
        self._dead_detail: str | None = None
        self._answers = 0  # frames received on the current connection
        self.frames_sent = 0
        self.bytes_sent = 0
        self.bytes_received = 0

    @property
    def epoch(self) -> int:
        """The current connection's epoch (0 before the first connection)."""
        return self._epoch

    # -- the consumer's commands ----------------------------------------

    def send(self, epoch: int, outgoing: Outgoing) -> bool:
        """Queue a message for connection ``epoch``; False (dropped) if that connection is gone."""
        if epoch != self._epoch or self._ws is None or self._abort_detail is not None:
            return False
        self._queue.put_nowait(outgoing)
        return True

    def abort(self, epoch: int, detail: str, code: int = CLOSE_PROTOCOL_ERROR, slowly: bool = False) -> None:
        """Close connection ``epoch`` and reconnect later: the trainer broke the protocol (1002), or
        (1000) the connection holds a chunk that can only be dropped with it. ``slowly``: every
        reconnect will meet the same problem (a trainer that does not fit the configuration), so
        wait ``reconnect_max_s`` before the next one."""
        if epoch == self._epoch and self._ws is not None and self._abort_detail is None:
            self._abort_detail = detail
            self._abort_code = code
            self._abort_retry_s = self._settings.reconnect_max_s if slowly else None
            self._queue.put_nowait(None)

    def stop(self) -> None:
        """Stop for good: close the connection with 1000 and make :meth:`run` return."""
        self._stopping.set()
        self._queue.put_nowait(None)

    # -- the loop --------------------------------------------------------

    async def run(self) -> CloseKind:
        """Connect and reconnect until the run finishes, a fatal error, or :meth:`stop`."""
        warning = plain_link_warning(self._settings, os.environ)
        if warning is not None:
            self._emit(Notice(warning))
        while not self._stopping.is_set():
            try:
                ws = await self._connect()
                if ws is None:
                    break  # stopped while connecting
            except (*CONNECTION_FAULTS, InvalidURI) as exc:
                if isinstance(exc, InvalidURI):
                    self._fatal_detail = f"invalid trainer URI {self._settings.uri!r}"
                    return CloseKind.FATAL
                delay = self._backoff.next_delay()
                self._emit(ConnectFailed(describe(exc), delay))
                await self._sleep(delay)
                continue
            self._epoch += 1
            self._ws = ws
            self._abort_detail = None
            self._abort_retry_s = None
            self._dead_detail = None
            self._answers = 0
            self._queue = asyncio.Queue()
            set_tcp_timeout(ws, self._settings.tcp_timeout_s)
            self._emit(Connected(self._epoch, self._settings.uri))
            self._await_answer()  # the trainer speaks first: its metadata is the first answer
            try:
                kind, detail, progressed = await self._serve(ws)
            except CONNECTION_FAULTS as exc:
                # a connection may fail at any point (a reset while closing, a frame cut off): it is lost
                kind, detail, progressed = CloseKind.LOST, f"{close_detail(ws)} ({describe(exc)})", False
            self._answer_came()
            self._ws = None
            self._emit(Disconnected(self._epoch, kind, detail))
            if kind is CloseKind.FATAL:
                self._fatal_detail = detail
                return kind
            if kind is CloseKind.CLIENT:
                return kind
            if kind is CloseKind.STOP and not self._settings.wait_for_next_run:
                return kind
            if self._abort_retry_s is not None and kind is CloseKind.ABORTED:
                delay = self._abort_retry_s
            else:
                if progressed:
                    self._backoff.reset()
                delay = 0.0 if kind is CloseKind.RESYNC and progressed else self._backoff.next_delay()
            await self._sleep(delay)
        return CloseKind.CLIENT

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

    @property
    def fatal_detail(self) -> str | None:
        return self._fatal_detail

    # -- dead-link detection ------------------------------------------------

    def _await_answer(self) -> None:
        """Start the clock on the answer we now wait for; when it runs out the link is dead."""
        first = self._answers < 2  # metadata and the first action: a model may be compiling
        bound = self._settings.first_answer_timeout_s if first else self._settings.answer_timeout_s
        if bound <= 0:
            return
        self._answer_came()
        self._overdue = asyncio.get_running_loop().call_later(bound, self._answer_overdue, self._epoch, bound, first)

    def _answer_came(self) -> None:
        if self._overdue is not None:
            self._overdue.cancel()
            self._overdue = None

    def _answer_overdue(self, epoch: int, bound: float, first: bool) -> None:
        self._overdue = None
        if epoch != self._epoch or self._ws is None or self._dead_detail is not None:
            return
        which = "first_answer_timeout_s" if first else "answer_timeout_s"
        self._dead_detail = f"no answer from the trainer within {bound:g} s (trainer.{which}): the link is dead"
        # the writer may be stuck in a send on a link that takes nothing more: cancel it, not queue behind it
        if self._writer is not None:
            self._writer.cancel()

    async def _serve(self, ws: ClientConnection) -> tuple[CloseKind, str, bool]:
        writer = asyncio.ensure_future(self._write(ws))
        self._writer = writer
        frames = 0
        try:
            while True:
                reader = asyncio.ensure_future(ws.recv())
                done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
                if reader not in done:
                    # the writer finished: we are stopping, aborting, or the send failed
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
                    return await self._close_ours(ws, writer, frames)
                try:
                    frame = reader.result()
                except ConnectionClosed:
                    code, reason = close_frame(ws)
                    kind = CloseKind.CLIENT if self._stopping.is_set() else classify_close(code, reason)
                    return kind, close_detail(ws), frames > 1
                if isinstance(frame, str):
                    # A text frame is fatal (docs/protocol.md, Closing). Nothing more may be
                    # sent, not even what is already queued.
                    writer.cancel()
                    await asyncio.gather(writer, return_exceptions=True)
                    await ws.close(CLOSE_UNSUPPORTED_DATA, "text frame")
                    return CloseKind.FATAL, f"the trainer sent a text frame: {frame[:200]!r}", frames > 1
                frames += 1
                self._answers += 1
                self._answer_came()
                self.bytes_received += len(frame)
                self._emit(FrameReceived(self._epoch, frame))
        finally:
            # collect the writer's outcome too (a send that failed as the
            # connection closed is expected, not an unretrieved error)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    async def _close_ours(
        self, ws: ClientConnection, writer: asyncio.Future, frames: int
    ) -> tuple[CloseKind, str, bool]:
        exc = writer.exception() if not writer.cancelled() else None
        if self._dead_detail is not None and not self._stopping.is_set():
            # the close frame will likely never arrive; close_timeout bounds the wait, then TCP is dropped
            await ws.close(CLOSE_NORMAL, "no answer")
            return CloseKind.LOST, self._dead_detail, frames > 1
        if self._stopping.is_set():
            await ws.close(CLOSE_NORMAL)
            return CloseKind.CLIENT, "stopped", frames > 1
        if self._abort_detail is not None:
            await ws.close(self._abort_code, "protocol error" if self._abort_code == CLOSE_PROTOCOL_ERROR else "")
            return CloseKind.ABORTED, self._abort_detail, frames > 1
        # the send failed because the connection closed under us
        await ws.wait_closed()
        code, reason = close_frame(ws)
        return (
            classify_close(code, reason),
            f"{close_detail(ws)} ({describe(exc) if exc else 'closed'})",
            frames > 1,
        )

    async def _write(self, ws: ClientConnection) -> None:
        queue = self._queue
        while True:
            outgoing = await queue.get()
            if outgoing is None:
                return
            # One message, one frame: the protocol's framing rule (binary frames only, one message
            # per frame). A fragmented message (websockets sends an iterable that way) would save
            # a copy of the images but breaks a trainer that reads frames, not messages.
            data = outgoing.encode()
            await ws.send(data)
            self.frames_sent += 1
            self.bytes_sent += len(data)
            if outgoing.kind == "infer":
                self._await_answer()

    async def _sleep(self, delay: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        except asyncio.TimeoutError:
            pass


# What a connection can fail with at any point, from the handshake to the close: each is a lost
# connection (reconnect with backoff), never the end of the link. websockets reports most as
# ConnectionClosed or InvalidHandshake; a reset can surface as an OSError from the socket itself.
CONNECTION_FAULTS = (OSError, EOFError, WebSocketException, asyncio.TimeoutError)


class RedirectRefused(InvalidHandshake):
    """The server answered the handshake with a redirect: a link never follows one."""


class _Connect(connect):
    """websockets' ``connect``, refusing every redirect (websockets follows up to 10, and 15.0 sends the key along).

    Whoever answers at a link's URI must not be able to send the robot, and its
    API key, somewhere else: the URI in the params file is the only address a
    link opens.
    """

    def process_redirect(self, exc: Exception) -> Exception | str:
        if isinstance(exc, InvalidStatus) and 300 <= exc.response.status_code < 400:
            status = exc.response.status_code
            target = exc.response.headers.get("Location", "nowhere")
            return RedirectRefused(
                f"the server at {self.uri} answered HTTP {status}, a redirect to {target}; links never follow "
                "redirects: set the URI to the address that serves the link itself"
            )
        return exc


def open_connection(s: ClientSettings) -> Awaitable[ClientConnection]:
    """Open the link ``s`` describes (the trainer's, or a policy server's): :func:`connect_options`, no redirects."""
    return _Connect(s.uri, **connect_options(s))


def connect_options(s: ClientSettings) -> dict[str, Any]:
    """websockets' ``connect`` options for a link as ``s`` describes it (the trainer's, or a policy server's)."""
    options: dict[str, Any] = {
        "compression": None,  # permessage-deflate must not be negotiated
        "max_size": s.max_frame_bytes,  # default None: any size (metadata alone may pass 1 MiB)
        "ping_interval": None,  # the peer's own timeouts are the liveness check, not pings
        "ping_timeout": None,
        "open_timeout": s.open_timeout_s,
        "close_timeout": s.close_timeout_s,
        "logger": _library_logger(),
        "proxy": None,  # a robot's HTTP proxy settings are not for the trainer link
    }
    if s.api_key_env:
        key = os.environ.get(s.api_key_env, "")
        if key:
            options["additional_headers"] = {"Authorization": f"Api-Key {key}"}
    if s.uri.startswith("wss://"):
        options["ssl"] = ssl.create_default_context(cafile=s.ca_file or None)
    return options


def set_tcp_timeout(ws: ClientConnection, timeout_s: float) -> None:
    """Make the kernel give up on a peer that stops acknowledging within about ``timeout_s``.

    Keepalive probes find a dead peer while nothing is being sent (idle after
    a third of the bound, then three probes); ``TCP_USER_TIMEOUT`` bounds how
    long sent data may stay unacknowledged. Options the platform lacks are skipped.
    A connection that is already gone (a server that reset it right after the
    handshake) gets none: its first read reports it lost, as any lost connection.
    """
    if timeout_s <= 0:
        return
    sock = ws.transport.get_extra_info("socket")
    if sock is None or ws.transport.is_closing() or sock.fileno() < 0:
        return
    idle = max(1, int(timeout_s / 3))
    interval = max(1, int(timeout_s / 6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", 3),
        ("TCP_USER_TIMEOUT", int(timeout_s * 1000)),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def close_frame(ws: ClientConnection) -> tuple[int | None, str | None]:
    """The code and reason of the trainer's close frame; 1006 and no reason if none came."""
    received = ws.protocol.close_rcvd
    if received is None:
        return 1006, None  # no close frame: the connection dropped
    return received.code, received.reason


def close_detail(ws: ClientConnection) -> str:
    """How the connection ended, for logs: the trainer's close frame, ours, or none."""
    received, sent = ws.protocol.close_rcvd, ws.protocol.close_sent
    if received is not None:
        return f"code {received.code}, reason {received.reason!r}"
    if sent is not None:
        return f"closed by this client with code {sent.code} ({sent.reason or 'no reason'})"
    return "dropped without a close frame (1006)"


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300] + _hint(exc)


def _hint(exc: BaseException) -> str:
    """What an operator can do about a refused connection (the two refusals a misconfiguration causes)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            " (the server's certificate is not trusted: give the CA that signed it as ca_file, "
            "and connect by a host name the certificate names)"
        )
    if isinstance(exc, InvalidStatus) and exc.response.status_code == 401:
        return " (the server wants an API key, or another one: api_key_env must name a variable holding its key)"
    return ""
