"""The transport and close clauses: what the handshake offered, and what a client does after a text frame."""

from __future__ import annotations

import asyncio

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from plugrl_ros.protocol.codec import unpackb
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.messages import FEEDBACK, INFER
from plugrl_ros.tools.test_trainer.clauses import NO_COMPRESSION, TEXT_FATAL
from plugrl_ros.tools.test_trainer.exchange import Exchange
from plugrl_ros.tools.test_trainer.report import Recorder

TEXT_FRAME = (
    "Traceback (most recent call last):\n"
    '  File "trainer.py", line 1, in learn\n'
    "RuntimeError: plugrl-test-trainer simulates a server-side failure (script entry 'text')"
)


def _article(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def message_type_of(frame: bytes | str) -> str | None:
    """The message_type of a frame, or None when it has none we can read."""
    if isinstance(frame, str):
        return None
    try:
        message = unpackb(frame)
    except ProtocolError:
        return None
    kind = message.get("message_type") if isinstance(message, dict) else None
    return kind if isinstance(kind, str) else None


def describe_frame(frame: bytes | str) -> str:
    """A frame as a report line names it."""
    if isinstance(frame, str):
        return f"a text frame {frame[:40]!r}"
    kind = message_type_of(frame)
    return _article(kind[:40]) if kind is not None else f"a frame of {len(frame)} bytes without a message_type"


def check_compression(rec: Recorder, number: int, ws: ServerConnection) -> None:
    """transport.no-compression: the handshake must not offer permessage-deflate."""
    request = ws.request
    offers = request.headers.get_all("Sec-WebSocket-Extensions") if request is not None else []
    deflate = [offer for offer in offers if "permessage-deflate" in offer.lower()]
    problems = [f"the handshake offered compression (Sec-WebSocket-Extensions: {deflate[0][:80]})"] if deflate else []
    rec.check(NO_COMPRESSION, f"connection {number}", problems)


async def text_ending(rec: Recorder, number: int, ws: ServerConnection, exchange: Exchange, grace_s: float) -> bool:
    """Send a text frame and watch: the client must send nothing more and close. True if it closed."""
    loop = asyncio.get_running_loop()
    try:
        await ws.send(TEXT_FRAME)
    except ConnectionClosed:
        return True
    deadline = loop.time() + grace_s
    # A client that has not read the text frame yet may still send the
    # feedback of the action just sent and then its next infer: neither
    # proves it ignored the text frame. Anything after those two does.
    in_flight = [FEEDBACK, INFER]
    extra: list[str] = []
    closed = False
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            frame = await asyncio.wait_for(ws.recv(), remaining)
        except asyncio.TimeoutError:
            break
        except ConnectionClosed:
            closed = True
            break
        if not extra and in_flight and message_type_of(frame) == in_flight[0] == exchange.expecting:
            rec.note(
                f"{_article(in_flight[0])} crossed the text frame on connection {number} "
                "(sent before the client could have read it); accepted",
                f"crossed {in_flight[0]}",
            )
            in_flight.pop(0)
            exchange.receive(frame)  # checked like any other message; the trainer answers nothing now
            continue
        in_flight.clear()
        extra.append(describe_frame(frame))
    where = f"connection {number}"
    problems = [f"the client sent {len(extra)} more frame(s) after the text frame, first {extra[0]}"] if extra else []
    rec.check(TEXT_FATAL, where, problems)
    rec.check(
        TEXT_FATAL,
        where,
        [] if closed else [f"the client had not closed the connection {grace_s:g} s after the text frame"],
    )
    return closed
