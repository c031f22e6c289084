"""Serving a trainer or a policy server: the websocket options, who may connect, and a trainer on its thread."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

from websockets.asyncio.server import Request, Response, Server, ServerConnection, serve

from plugrl_ros.protocol.client import redacting_logger
from plugrl_ros.protocol.server_auth import (
    DEFAULT_API_KEY_ENV,
    ApiKeyGate,
    RefusalLog,
    ServerAccess,
    without_handshake_noise,
)
from plugrl_ros.thread_guard import crash_of

log = logging.getLogger("plugrl_ros.serving")

R_co = TypeVar("R_co", covariant=True)
Result = TypeVar("Result")


async def serve_trainer(
    handler: Callable[[ServerConnection], Awaitable[Any]],
    host: str,
    port: int,
    close_timeout: float,
    *,
    access: ServerAccess | None,
    process_request: Callable[[ServerConnection, Request], Response | None] | None = None,
    logger: logging.Logger | None = None,
) -> Server:
    """Listen as a PlugRL trainer (or a policy server): no compression, frames of any size, no keepalive pings.

    ``access`` (None: no key, no TLS; a test fixture's choice, and a required
    argument so that no server forgets it) sets the API key
    every handshake must carry and the certificate for ``wss://``; an unusable
    one raises :class:`~plugrl_ros.protocol.server_auth.AccessError` before
    anything listens. ``process_request`` may answer a plain HTTP request
    itself (a health check, which needs no key); what it lets through, the key
    check sees next.
    """
    access = access or ServerAccess(api_key_env="")
    logger = logger or logging.getLogger("plugrl_ros.server")
    key = access.api_key(os.environ)
    tls = access.tls_context()
    gate = ApiKeyGate(key, RefusalLog(logger)) if key is not None else None

    def check(connection: ServerConnection, request: Request) -> Response | None:
        answer = process_request(connection, request) if process_request is not None else None
        if answer is None and gate is not None:
            answer = gate(connection, request)
        return answer

    server = await serve(
        handler,
        host,
        port,
        compression=None,  # permessage-deflate must not be negotiated
        max_size=None,  # frames of any size
        ping_interval=None,  # the feedback timeout is the protocol's liveness check
        ping_timeout=None,
        close_timeout=close_timeout,
        ssl=tls,
        process_request=check if process_request is not None or gate is not None else None,
        # handshakes carry the client's API key; refused ones are the RefusalLog's to report
        logger=without_handshake_noise(redacting_logger("plugrl_ros.websockets.server")),
    )
    level, text = access.describe(os.environ, host)
    logger.log(level, text)
    return server


def add_access_options(parser: argparse.ArgumentParser) -> None:
    """The command-line options every shipped server takes for its API key and TLS (never the key itself)."""
    parser.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        metavar="VAR",
        help="environment variable holding the API key clients must send (default %(default)s; when it is unset "
        'the server needs no key; "" never asks for one)',
    )
    parser.add_argument("--tls-cert", default="", help="PEM certificate (chain) to serve wss:// instead of ws://")
    parser.add_argument("--tls-key", default="", help="PEM private key for --tls-cert (if not in the same file)")


def access_from(args: argparse.Namespace) -> ServerAccess:
    """The :class:`ServerAccess` of :func:`add_access_options`' options."""
    return ServerAccess(api_key_env=args.api_key_env, tls_cert=args.tls_cert, tls_key=args.tls_key)


class Trainer(Protocol[R_co]):
    """What :class:`TrainerThread` runs: a server that starts, serves until its run is over, and can be ended."""

    async def start(self) -> int:
        """Listen; the port."""
        ...

    async def finished(self) -> R_co:
        """Serve until the run is over; its result."""
        ...

    def end(self) -> None:
        """End the run now (called on the trainer's event loop)."""
        ...


class TrainerThread(Generic[Result]):
    """A trainer on its own event loop thread, for a process (or a test) that does other things meanwhile."""

    def __init__(self, trainer: Trainer[Result], name: str = "plugrl-trainer") -> None:
        self.trainer = trainer
        self._loop: asyncio.AbstractEventLoop | None = None
        self._port: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._result: concurrent.futures.Future[Result] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        async def main() -> Result:
            self._loop = asyncio.get_running_loop()
            self._port.set_result(await self.trainer.start())
            return await self.trainer.finished()

        try:
            self._result.set_result(asyncio.run(main()))
        except BaseException as exc:  # hand any failure to the thread that started this one
            if not self._port.done():
                self._port.set_exception(exc)  # start() raises it: the starter hears of it at once
            else:
                # while serving: nobody may look at the result for a long time, so say it now, with its traceback
                crash = crash_of(self._thread.name, exc)
                log.error("the %s thread stopped serving: %s\n%s", crash.thread, crash.error, crash.traceback.rstrip())
            self._result.set_exception(exc)

    def start(self, timeout: float = 10.0) -> int:
        """Start serving; the port it listens on (the trainer's own error if it could not start)."""
        self._thread.start()
        return self._port.result(timeout)

    @property
    def port(self) -> int:
        return self._port.result(0)

    @property
    def uri(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def result(self, timeout: float) -> Result:
        """The run's result once it is over (its exception if it failed; TimeoutError if still running)."""
        return self._result.result(timeout)

    @property
    def error(self) -> BaseException | None:
        """Why the run failed, once it has; None while it runs or if it succeeded."""
        return self._result.exception(0) if self._result.done() else None

    def end(self) -> None:
        """End the run now (from any thread)."""
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.trainer.end)

    def join(self, timeout: float) -> bool:
        """Wait for the thread; True if it finished."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
