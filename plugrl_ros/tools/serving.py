"""Serving PlugRL as a trainer: the websocket options PROTOCOL.md requires of both ends."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve


async def serve_trainer(
    handler: Callable[[ServerConnection], Awaitable[Any]],
    host: str,
    port: int,
    close_timeout: float,
    tls: ssl.SSLContext | None = None,
) -> Server:
    """Listen as a PlugRL trainer: no compression, frames of any size, no keepalive pings."""
    return await serve(
        handler,
        host,
        port,
        compression=None,  # permessage-deflate must not be negotiated
        max_size=None,  # frames of any size
        ping_interval=None,  # the feedback timeout is the protocol's liveness check
        ping_timeout=None,
        close_timeout=close_timeout,
        ssl=tls,
    )
