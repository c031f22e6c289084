"""A websocket server that breaks every connection in one of the ways a network or a restarting server does.

It speaks HTTP and websocket framing by hand (no websockets library on this
side), so each fault lands exactly where it is named: before the HTTP 101,
right after it, after the server's first frame (the metadata), in the middle
of a frame, with a TCP reset or with a close frame. Connection ``n`` (from 0)
meets ``faults[n % len(faults)]``; :attr:`FaultServer.seen` lists what each
connection met, in order.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import socket
import struct
import threading
from collections.abc import Callable

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked, final server frame."""
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return header + payload


def accept_response(request: bytes) -> bytes:
    """The HTTP 101 that completes the opening handshake of ``request``."""
    key = b""
    for line in request.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"sec-websocket-key":
            key = value.strip()
    accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
    return (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
    )


def reset(writer: asyncio.StreamWriter) -> None:
    """Drop the connection with a TCP RST (SO_LINGER 0), as a crashed host or a load balancer does."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Fault:
    """What a connection meets; ``metadata`` is the server's first frame in the mode under test.

    ``after_101``: the server completes the handshake (sends the 101) before ``run``.
    """

    def __init__(
        self,
        name: str,
        run: Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], object],
        after_101: bool = True,
    ) -> None:
        self.name = name
        self.run = run
        self.after_101 = after_101


async def _reset_before_101(reader, writer, metadata):
    reset(writer)


async def _close_before_101(reader, writer, metadata):
    writer.close()


async def _refuse_with_503(reader, writer, metadata):
    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    await writer.drain()
    writer.close()


async def _reset_after_101(reader, writer, metadata):
    reset(writer)  # the 101 went out with the handshake; nothing else


async def _close_after_101(reader, writer, metadata):
    writer.close()


async def _reset_after_metadata(reader, writer, metadata):
    writer.write(frame(0x2, metadata))
    await writer.drain()
    reset(writer)


async def _reset_mid_frame(reader, writer, metadata):
    whole = frame(0x2, metadata)
    writer.write(whole[: max(3, len(whole) // 2)])
    await writer.drain()
    reset(writer)


async def _close_mid_frame(reader, writer, metadata):
    whole = frame(0x2, metadata)
    writer.write(whole[: max(3, len(whole) // 2)])
    await writer.drain()
    writer.close()


async def _close_frame_after_metadata(reader, writer, metadata):
    writer.write(frame(0x2, metadata) + frame(0x8, struct.pack("!H", 1011) + b"restarting"))
    await writer.drain()
    # the client answers the close; then the server ends TCP, as the websocket close handshake says
    await asyncio.wait_for(reader.read(1 << 16), 10)
    writer.close()


async def _invalid_frame(reader, writer, metadata):
    writer.write(frame(0x2, metadata) + bytes([0xF2, 0x01, 0x00]))  # reserved bits set: a protocol violation
    await writer.drain()
    await asyncio.wait_for(reader.read(1 << 16), 10)
    writer.close()


FAULTS = [
    Fault("reset before 101", _reset_before_101, after_101=False),
    Fault("close before 101", _close_before_101, after_101=False),
    Fault("HTTP 503", _refuse_with_503, after_101=False),
    Fault("reset after 101", _reset_after_101),
    Fault("close after 101", _close_after_101),
    Fault("reset after metadata", _reset_after_metadata),
    Fault("reset mid-frame", _reset_mid_frame),
    Fault("close mid-frame", _close_mid_frame),
    Fault("close frame after metadata", _close_frame_after_metadata),
    Fault("invalid frame", _invalid_frame),
]
AFTER_101 = {f.name for f in FAULTS if f.after_101}


class FaultServer:
    """The faulty server on its own event loop thread, on 127.0.0.1 (an ephemeral port)."""

    def __init__(self, metadata: bytes, faults: list[Fault] | None = None) -> None:
        self.metadata = metadata
        self.faults = faults or FAULTS
        self.seen: list[str] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="fault-server", daemon=True)

    def __enter__(self) -> FaultServer:
        self._thread.start()
        assert self._started.wait(30), "the fault server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the fault server did not stop"

    @property
    def uri(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def count(self) -> int:
        with self._lock:
            return len(self.seen)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        async with server:
            await self._stop.wait()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            fault = self.faults[len(self.seen) % len(self.faults)]
            self.seen.append(fault.name)
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            if fault.after_101:
                writer.write(accept_response(request))
                await writer.drain()
            await fault.run(reader, writer, self.metadata)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, asyncio.LimitOverrunError):
            writer.transport.abort()  # the client left first: this connection's fault is moot
