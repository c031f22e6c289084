"""A small scripted PlugRL trainer for tests: answers infers through a callback and records what the client sent.

It runs on its own asyncio thread, so a test drives it with plain calls:
:meth:`ScriptedTrainer.wait_for` waits for a condition over the recorded
messages, :meth:`ScriptedTrainer.close` closes the current connection with a
chosen code and reason. Each connection runs through the package's
trainer-side protocol core (lenient): what the client broke is kept in
:attr:`ScriptedTrainer.violations`, and nothing is enforced, so a test sees
every frame the client sent (the protocol-checking trainer is
:mod:`plugrl_ros.tools.test_trainer`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ConnectionClosed

from plugrl_ros.protocol.codec import packb, unpackb
from plugrl_ros.protocol.server_messages import Problem, Resync
from plugrl_ros.protocol.trainer_connection import ServerPhase, TrainerConnection
from plugrl_ros.tools.serving import serve_trainer

# actions(env_indices, step_ids, observation) -> [H, n, d] chunk, or None to leave the infer unanswered
ActionsCallback = Callable[[np.ndarray, np.ndarray, dict], "np.ndarray | None"]
Record = tuple[int, dict]  # (connection index, decoded client message)


def zeros(horizon: int, action_dim: int) -> ActionsCallback:
    """The default answer: a chunk of zeros."""

    def actions(env_indices: np.ndarray, step_ids: np.ndarray, observation: dict) -> np.ndarray:
        del step_ids, observation
        return np.zeros((horizon, len(env_indices), action_dim), dtype="<f4")

    return actions


class ScriptedTrainer:
    """Sends ``metadata`` on every connection and answers each infer with ``actions(...)``.

    Connections are numbered from 0 in the order they open. Every decoded
    client message is recorded as ``(connection, message)``; a text frame is
    recorded as ``{"message_type": "<text frame>", "text": ...}``. The close of
    each connection is recorded as ``closes[connection] = (code, reason)``,
    the code and reason of the client's close frame as the server received it
    (for a close the trainer started, the client's echo of it; 1006 when the
    connection dropped without one).
    """

    def __init__(
        self,
        metadata: dict[str, Any] | None = None,
        actions: ActionsCallback | None = None,
        port: int = 0,
        answer_delay_s: float = 0.0,
        metadata_delay_s: float = 0.0,
    ) -> None:
        self.metadata = {"protocol_version": 1, "server": "trainer_fixture"} if metadata is None else metadata
        horizon = int(self.metadata.get("action_horizon", 1))
        self.actions = actions or zeros(horizon, int(self.metadata.get("action_dim", 1)))
        self.answer_delay_s = answer_delay_s  # wait this long before answering an infer
        self.metadata_delay_s = metadata_delay_s  # wait this long after the handshake before the metadata
        self._port = port
        self._lock = threading.Condition()
        self._records: list[Record] = []
        self._arrivals: list[float] = []  # time.monotonic() of each record
        self.closes: dict[int, tuple[int | None, str]] = {}
        self.opened: list[float] = []  # time.monotonic() at which each connection opened
        self.violations: list[tuple[int, Problem]] = []  # (connection, what the client broke), never enforced
        self._connections: list[ServerConnection] = []
        self._errors: list[BaseException] = []
        self._loop = asyncio.new_event_loop()
        self._server: Server | None = None
        self._ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name="trainer-fixture", daemon=True)

    # -- lifetime ------------------------------------------------------------

    def start(self) -> ScriptedTrainer:
        self._thread.start()
        self._ready.result(timeout=10)
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> ScriptedTrainer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._ready.result(timeout=10)

    @property
    def uri(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # hand a failure to start to the test thread
            self._ready.set_exception(exc)
            return
        self._ready.set_result(next(iter(self._server.sockets)).getsockname()[1])
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            self._loop.run_until_complete(self._server.wait_closed())
            self._loop.close()

    async def _serve(self) -> Server:
        return await serve_trainer(self._handle, "127.0.0.1", self._port, close_timeout=2, access=None)

    # -- serving ---------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        with self._lock:
            index = len(self._connections)
            self._connections.append(ws)
            self.opened.append(time.monotonic())
        try:
            if self.metadata_delay_s:
                # silent for a while; a client that closes meanwhile is recorded at once
                closed = asyncio.ensure_future(ws.wait_closed())
                await asyncio.wait({closed}, timeout=self.metadata_delay_s)
                closed.cancel()
            conn = TrainerConnection(strict=False)
            await ws.send(packb(conn.send_metadata(self.metadata)))
            async for frame in ws:
                self._check(index, conn, frame)
                if isinstance(frame, str):
                    self._record(index, {"message_type": "<text frame>", "text": frame})
                    continue
                message = unpackb(frame)
                self._record(index, message)
                if message.get("message_type") == "infer":
                    await self._answer(ws, conn, message)
        except ConnectionClosed:
            pass
        except BaseException as exc:  # a broken callback must fail the test, not vanish
            with self._lock:
                self._errors.append(exc)
            raise
        finally:
            received = ws.protocol.close_rcvd
            with self._lock:
                self.closes[index] = (1006, "") if received is None else (received.code, received.reason)
                self._lock.notify_all()

    def _check(self, index: int, conn: TrainerConnection, frame: bytes | str) -> None:
        """Run the frame through the protocol core and keep what it found; after a resync there is no stream."""
        if conn.phase is ServerPhase.CLOSED:
            return
        try:
            checked = conn.receive(frame)
        except Resync as exc:
            found: tuple[Problem, ...] = (exc.problem,)
        else:
            found = checked.violations
        with self._lock:
            self.violations.extend((index, problem) for problem in found)

    async def _answer(self, ws: ServerConnection, conn: TrainerConnection, infer: dict) -> None:
        env_indices, step_ids = infer["env_indices"], infer["step_ids"]
        chunk = self.actions(env_indices, step_ids, infer["data"])
        if chunk is None:
            return
        if self.answer_delay_s:
            await asyncio.sleep(self.answer_delay_s)
        if conn.phase is ServerPhase.ANSWER:
            conn.answered()
        # built here rather than by the core: a test may answer with a malformed chunk on purpose
        action = {"env_ids": np.asarray(env_indices, dtype="<i8"), "action": np.asarray(chunk)}
        await ws.send(packb({"message_type": "action", "data": action}))

    def _record(self, index: int, message: dict) -> None:
        with self._lock:
            self._records.append((index, message))
            self._arrivals.append(time.monotonic())
            self._lock.notify_all()

    # -- the test's commands (any thread) --------------------------------------

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._connections)

    def records(self) -> list[Record]:
        """Every ``(connection, message)`` so far, in arrival order."""
        with self._lock:
            self._raise_errors()
            return list(self._records)

    def timed_records(self) -> list[tuple[float, int, dict]]:
        """As :meth:`records`, with the ``time.monotonic()`` of each arrival."""
        with self._lock:
            self._raise_errors()
            return [(t, c, m) for t, (c, m) in zip(self._arrivals, self._records)]

    def messages(self, kind: str | None = None, connection: int | None = None) -> list[dict]:
        """The recorded messages of one ``message_type`` (all if None), optionally of one connection."""
        return [
            m
            for c, m in self.records()
            if (kind is None or m.get("message_type") == kind) and (connection is None or c == connection)
        ]

    def wait_for(self, predicate: Callable[[list[Record]], Any], timeout: float, what: str = "") -> Any:
        """Wait until ``predicate(records)`` is truthy and return its value; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                self._raise_errors()
                value = predicate(list(self._records))
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    kinds = [m.get("message_type") for _, m in self._records[-12:]]
                    raise AssertionError(
                        f"trainer: timed out after {timeout:g} s waiting for {what or predicate}; "
                        f"{len(self._records)} messages on {len(self._connections)} connection(s), "
                        f"last kinds {kinds}, closes {self.closes}"
                    )
                self._lock.wait(min(left, 0.05))

    def wait_closed(self, connection: int, timeout: float) -> tuple[int | None, str]:
        """The (code, reason) of ``connection``'s close, once it has closed."""
        self.wait_for(lambda _: connection in self.closes, timeout, f"connection {connection} to close")
        with self._lock:
            return self.closes[connection]

    def close(self, code: int, reason: str, timeout: float = 5.0) -> None:
        """Close the current (newest) connection with ``code`` and ``reason``."""
        with self._lock:
            assert self._connections, "no client has connected"
            ws = self._connections[-1]
        asyncio.run_coroutine_threadsafe(ws.close(code, reason), self._loop).result(timeout)

    def _raise_errors(self) -> None:
        if self._errors:
            raise AssertionError(f"trainer fixture failed: {self._errors[0]!r}") from self._errors[0]
