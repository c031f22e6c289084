"""``plugrl-test-policy-server``: an openpi-compatible policy server for tests, benchmarks and the demo.

It speaks the contract of openpi's ``WebsocketPolicyServer``: metadata
first, then one answer ``{"actions": [H, action_dim], "server_timing": ...}``
per observation; a failure is a text frame with the traceback and a close
with 1011; ``GET /healthz`` answers 200. On top, what tests need: a
configurable latency (fixed, plus a uniform jitter), a slow first answer on
each connection, a failure after N requests, and, without a policy file,
actions that say where they came from. Each row ``k`` of chunk ``n`` is::

    [n, k, stamp, stamp + k, stamp + k, ...]   (cut to action_dim)

where ``n`` counts the server's answers from 0 and ``stamp`` is the first
value of the observation's stamp key (``observation/state`` by default). A
robot that puts its tick count there can decode, from any applied action,
which step of which chunk it is and the tick it was computed for.

With ``--linear weights.npz`` it serves a plain linear policy instead: the
file holds ``W`` (``[action_dim, state_dim]``) and optionally ``b``
(``[action_dim]``); every row of the chunk is ``W @ state + b``, ``state``
read from the stamp key; a comma-separated stamp key (``state/joints,state/target``)
concatenates those values in that order, for a policy learned over several states.
"""

from __future__ import annotations

import argparse
import asyncio
import http
import json
import logging
import random
import signal
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.server import Request, Response, Server, ServerConnection
from websockets.exceptions import ConnectionClosed

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.server_auth import DEFAULT_API_KEY_ENV, AccessError, ServerAccess
from plugrl_ros.tools.serving import add_access_options, serve_trainer

log = logging.getLogger("plugrl_ros.test_policy_server")

CLOSE_INTERNAL_ERROR = 1011
CLOSE_REASON = "Internal server error. Traceback included in previous frame."


@dataclass(frozen=True)
class PolicyServerSettings:
    host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port
    horizon: int = 10
    action_dim: int = 4
    action_key: str = "actions"
    stamp_key: str = "observation/state"  # "a/b" also finds {"a": {"b": ...}}
    latency_s: float = 0.0
    jitter_s: float = 0.0  # each answer waits latency_s + uniform(0, jitter_s)
    slow_start_s: float = 0.0  # added to the first answer of every connection
    slow_connection: int = 0  # > 0: the n-th connection (server-wide, from 1) answers slow_connection_s later
    slow_connection_s: float = 0.0
    fail_after: int = 0  # > 0: the request after this many (server-wide) fails with a traceback and 1011
    metadata: Mapping[str, Any] | None = None  # None: {"action_horizon": H, "action_dim": D}
    linear: str = ""  # .npz with W (and b): serve W @ state + b instead of the encoded actions
    seed: int = 0
    tls_cert: str = ""
    tls_key: str = ""
    api_key_env: str = DEFAULT_API_KEY_ENV  # the variable holding the key clients must send (docs/security.md)

    def __post_init__(self) -> None:
        if self.horizon < 1 or self.action_dim < 1:
            raise ValueError("horizon and action_dim must be at least 1")
        if (
            min(self.latency_s, self.jitter_s, self.slow_start_s, self.slow_connection_s) < 0
            or min(self.fail_after, self.slow_connection) < 0
        ):
            raise ValueError("latencies and --fail-after must not be negative")

    @property
    def scheme(self) -> str:
        return self.access.scheme

    @property
    def access(self) -> ServerAccess:
        return ServerAccess(api_key_env=self.api_key_env, tls_cert=self.tls_cert, tls_key=self.tls_key)


@dataclass
class Seen:
    """What the server saw, for tests: requests, and what each handshake offered."""

    observations: list[Any] = field(default_factory=list)
    # (connection from 1, "request" or "answer", the decoded request or the answer map as sent), in order
    transcript: list[tuple[int, str, Any]] = field(default_factory=list)
    authorization: list[str | None] = field(default_factory=list)
    extensions: list[str | None] = field(default_factory=list)
    connections: int = 0
    answers: int = 0
    failures: int = 0


class LinearPolicy:
    """``W @ state + b``, loaded from an ``.npz`` file (no pickle)."""

    def __init__(self, path: str, action_dim: int) -> None:
        with np.load(path, allow_pickle=False) as data:
            if "W" not in data:
                raise ValueError(f"{path}: needs an array W [action_dim, state_dim] (and optionally b)")
            self.W = np.asarray(data["W"], dtype=np.float64)
            self.b = np.asarray(data["b"], dtype=np.float64) if "b" in data else np.zeros(self.W.shape[0])
        if self.W.ndim != 2 or self.W.shape[0] != action_dim or self.b.shape != (action_dim,):
            raise ValueError(
                f"{path}: W must be [{action_dim}, state_dim] and b [{action_dim}], "
                f"got W {list(self.W.shape)}, b {list(self.b.shape)}"
            )

    def act(self, state: np.ndarray) -> np.ndarray:
        state = np.asarray(state, dtype=np.float64).reshape(-1)
        if state.shape[0] != self.W.shape[1]:
            raise ValueError(f"the state has {state.shape[0]} values, the policy reads {self.W.shape[1]}")
        return self.W @ state + self.b


def lookup(observation: Any, key: str) -> Any:
    """``observation[key]``, or the nested value ``key``'s ``/``-separated path names."""
    if isinstance(observation, Mapping) and key in observation:
        return observation[key]
    value = observation
    for part in key.split("/"):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(f"the observation has no {key!r} (keys: {sorted(map(str, observation))})")
        value = value[part]
    return value


def encoded_chunk(number: int, stamp: float, horizon: int, width: int) -> np.ndarray:
    """The actions that say where they came from: row k is ``[number, k, stamp, stamp + k, ...]``."""
    rows = np.empty((horizon, max(width, 3)), dtype=np.float32)
    k = np.arange(horizon, dtype=np.float32)
    rows[:, 0] = number
    rows[:, 1] = k
    rows[:, 2] = stamp
    rows[:, 3:] = (stamp + k)[:, None]
    return rows[:, :width].copy()


def decode_row(row: Sequence[float]) -> tuple[int, int, float]:
    """``(chunk number, index, stamp)`` of one row of :func:`encoded_chunk` (at least 3 wide)."""
    return round(row[0]), round(row[1]), float(row[2])


class TestPolicyServer:
    """The server; :meth:`start` listens and returns the port, :meth:`close` stops it."""

    __test__ = False  # not a pytest class

    def __init__(self, settings: PolicyServerSettings) -> None:
        self.settings = settings
        self.seen = Seen()
        self._rng = random.Random(settings.seed)
        self._linear = LinearPolicy(settings.linear, settings.action_dim) if settings.linear else None
        self._server: Server | None = None
        self._handlers: set[asyncio.Task] = set()

    async def start(self) -> int:
        s = self.settings
        self._server = await serve_trainer(
            self._handle, s.host, s.port, close_timeout=1.0, access=s.access, process_request=self._http, logger=log
        )
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and close every connection with 1001 (going away)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def kill(self) -> None:
        """Stop listening and drop every connection without a close frame, as a killed server would."""
        if self._server is None:
            return
        self._server.close(close_connections=False)
        for connection in list(self._server.connections):
            connection.transport.abort()
        await self._server.wait_closed()

    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        given = request.headers.get_all("Authorization")  # several are possible: the key gate refuses them
        self.seen.authorization.append(", ".join(given) if given else None)
        self.seen.extensions.append(request.headers.get("Sec-WebSocket-Extensions"))
        return None

    def metadata(self) -> Any:
        s = self.settings
        if s.metadata is not None:
            return dict(s.metadata)
        return {"action_horizon": s.horizon, "action_dim": s.action_dim}

    async def _handle(self, ws: ServerConnection) -> None:
        self.seen.connections += 1
        connection = self.seen.connections
        slow = self.settings.slow_connection_s if self.seen.connections == self.settings.slow_connection else 0.0
        first = True
        await ws.send(codec.packb(self.metadata()))
        previous_total_ms: float | None = None
        while True:
            try:
                frame = await ws.recv()
            except ConnectionClosed:
                return
            started = time.monotonic()
            try:
                answer = self._answer(frame, connection)
            except Exception:
                self.seen.failures += 1
                await ws.send(traceback.format_exc())
                await ws.close(CLOSE_INTERNAL_ERROR, CLOSE_REASON)
                return
            delay = self.settings.latency_s + self._rng.uniform(0.0, self.settings.jitter_s) + slow
            if first:
                delay += self.settings.slow_start_s
                first = False
            if delay > 0:
                await asyncio.sleep(delay)  # the model's compute time
            timing = {"infer_ms": (time.monotonic() - started) * 1000}
            if previous_total_ms is not None:
                timing["prev_total_ms"] = previous_total_ms
            answer["server_timing"] = timing
            try:
                await ws.send(codec.packb(answer))
            except ConnectionClosed:
                return
            self.seen.transcript.append((connection, "answer", answer))
            self.seen.answers += 1
            previous_total_ms = (time.monotonic() - started) * 1000

    def _answer(self, frame: bytes | str, connection: int) -> dict[str, Any]:
        s = self.settings
        if isinstance(frame, str):
            raise TypeError("expected a binary msgpack frame, got a text frame")
        observation = codec.unpackb(frame)
        self.seen.observations.append(observation)
        self.seen.transcript.append((connection, "request", observation))
        number = len(self.seen.observations) - 1
        if s.fail_after and number == s.fail_after:
            raise RuntimeError(f"test failure: this server fails request {number} (--fail-after)")
        if self._linear is not None:
            state = [
                np.asarray(lookup(observation, key), dtype=np.float64).reshape(-1) for key in s.stamp_key.split(",")
            ]
            row = self._linear.act(np.concatenate(state))
            actions = np.repeat(row[None, :], s.horizon, axis=0).astype(np.float32)
        else:
            value = lookup(observation, s.stamp_key)
            stamp = float(np.asarray(value, dtype=np.float64).reshape(-1)[0])
            actions = encoded_chunk(number, stamp, s.horizon, s.action_dim)
        return {s.action_key: actions}


# -- command line ----------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    d = PolicyServerSettings()
    p = argparse.ArgumentParser(
        prog="plugrl-test-policy-server",
        description="An openpi-compatible policy server: encoded actions for tests, or a linear policy from a file.",
    )
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--horizon", type=int, default=d.horizon, help="H, steps per chunk")
    p.add_argument("--action-dim", type=int, default=d.action_dim)
    p.add_argument("--action-key", default=d.action_key)
    p.add_argument(
        "--stamp-key",
        default=d.stamp_key,
        help="observation key read as stamp (or linear state; a,b concatenates keys a and b)",
    )
    p.add_argument("--latency", type=float, default=d.latency_s, help="seconds each answer takes")
    p.add_argument("--jitter", type=float, default=d.jitter_s, help="plus uniform(0, jitter) seconds")
    p.add_argument("--slow-start", type=float, default=d.slow_start_s, help="extra seconds for a connection's first")
    p.add_argument(
        "--slow-connection", type=int, default=d.slow_connection, help="the n-th connection (from 1) answers slowly"
    )
    p.add_argument(
        "--slow-connection-s", type=float, default=d.slow_connection_s, help="extra seconds on its every answer"
    )
    p.add_argument(
        "--fail-after", type=int, default=d.fail_after, help="fail the request after this many, once (0: never)"
    )
    p.add_argument("--metadata", default=None, help="the metadata map, as JSON (default: action_horizon, action_dim)")
    p.add_argument("--linear", default="", help=".npz file with W [action_dim, state_dim] and optional b")
    p.add_argument("--seed", type=int, default=d.seed)
    add_access_options(p)
    return p


async def _serve_until_stopped(settings: PolicyServerSettings) -> int:
    server = TestPolicyServer(settings)
    try:
        port = await server.start()
    except AccessError as exc:
        print(f"plugrl-test-policy-server: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"plugrl-test-policy-server: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    print(f"listening on {settings.scheme}://{host}:{port}", flush=True)
    await stop.wait()
    await server.close()
    seen = server.seen
    print(f"stopped: {seen.connections} connections, {seen.answers} answers, {seen.failures} failures", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``plugrl-test-policy-server``: serve until SIGINT or SIGTERM, then exit 0 (2 if it cannot listen)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        metadata = json.loads(args.metadata) if args.metadata is not None else None
        settings = PolicyServerSettings(
            host=args.host,
            port=args.port,
            horizon=args.horizon,
            action_dim=args.action_dim,
            action_key=args.action_key,
            stamp_key=args.stamp_key,
            latency_s=args.latency,
            jitter_s=args.jitter,
            slow_start_s=args.slow_start,
            slow_connection=args.slow_connection,
            slow_connection_s=args.slow_connection_s,
            fail_after=args.fail_after,
            metadata=metadata,
            linear=args.linear,
            seed=args.seed,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            api_key_env=args.api_key_env,
        )
        if settings.linear:
            LinearPolicy(settings.linear, settings.action_dim)  # a bad file fails now, not at the first request
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="[plugrl-test-policy-server] %(message)s")  # access, refusals
    logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        return asyncio.run(_serve_until_stopped(settings))
    except KeyboardInterrupt:
        return 130  # interrupted before the signal handlers were installed


if __name__ == "__main__":
    sys.exit(main())
