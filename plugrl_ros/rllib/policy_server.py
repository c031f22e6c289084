"""``plugrl-policy-server --rllib CHECKPOINT --config robot.yaml``: an RLlib policy served as openpi serves one.

The contract is openpi's ``WebsocketPolicyServer``, the one the bridge's
``mode: deploy`` speaks (and openpi's own ``WebsocketClientPolicy``): on each
connection the server first sends a metadata map (``action_horizon``,
``action_dim``, what it serves); then every binary msgpack frame is one
robot's observation, answered with ``{"actions": float32 [H, action_dim],
"server_timing": {...}}``. A request that fails is answered, as openpi's server
does, with its traceback in a text frame and a close with 1011; the bridge
logs it, idles that robot and reconnects. ``GET /healthz`` answers 200.

The actions are the checkpoint's policy without exploration
(:mod:`plugrl_ros.rllib.checkpoint_policy`); which request key holds which
state or image comes from the bridge's own params file
(:mod:`plugrl_ros.rllib.request_reader`), checked against the checkpoint at
startup. Torch and Ray run here only: the robot needs neither.
"""

from __future__ import annotations

import argparse
import asyncio
import http
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from websockets.asyncio.server import Request, Response, Server, ServerConnection
from websockets.exceptions import ConnectionClosed

from plugrl_ros import __version__
from plugrl_ros.protocol import codec
from plugrl_ros.protocol.server_auth import AccessError, ServerAccess
from plugrl_ros.tools.serving import access_from, add_access_options, serve_trainer

log = logging.getLogger("plugrl_ros.rllib.policy_server")

SERVER_NAME = "plugrl-policy-server"
ACTION_KEY = "actions"
CLOSE_INTERNAL_ERROR = 1011
CLOSE_REASON = "Internal server error. Traceback included in previous frame."
EXIT_BAD_INPUT = 2


class RLlibPolicyServer:
    """Serves one :class:`~plugrl_ros.rllib.checkpoint_policy.CheckpointPolicy` to any number of robots.

    Requests are answered one at a time, in the event loop (a robot's
    observation through a small RLModule takes about a millisecond; the
    pipelines are not thread-safe).
    """

    def __init__(self, policy: Any, reader: Any, access: ServerAccess, host: str = "127.0.0.1", port: int = 0) -> None:
        """``access``: the API key every handshake must carry and the certificate for ``wss://``."""
        self.policy = policy
        self.reader = reader
        self.access = access
        self.host = host
        self.port = port
        self.answers = 0
        self.failures = 0
        self._server: Server | None = None

    def metadata(self) -> dict[str, Any]:
        import ray

        chunks = self.reader.chunks
        return {
            "server": SERVER_NAME,
            "server_version": __version__,
            "policy": f"RLlib {ray.__version__} {type(self.policy.module).__name__} (no exploration)",
            "checkpoint": str(self.policy.parts.root),
            "action_horizon": chunks.horizon,
            "action_dim": chunks.action_dim,
        }

    def answer(self, request: Any) -> dict[str, Any]:
        """The answer to one decoded request (raises on a request unlike the policy's observations)."""
        started = time.perf_counter()
        actions = self.policy.act(self.reader.observation(request), self.reader.chunks)
        return {ACTION_KEY: actions, "server_timing": {"infer_ms": (time.perf_counter() - started) * 1000}}

    async def start(self) -> int:
        """Listen; the port."""
        self._server = await serve_trainer(
            self._handle, self.host, self.port, close_timeout=1.0, access=self.access, process_request=_http, logger=log
        )
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, ws: ServerConnection) -> None:
        await ws.send(codec.packb(self.metadata()))
        while True:
            try:
                frame = await ws.recv()
            except ConnectionClosed:
                return
            try:
                if isinstance(frame, str):
                    raise TypeError("expected a binary msgpack frame holding an observation, got a text frame")
                answer = self.answer(codec.unpackb(frame))
            except Exception:  # what one robot sent: it hears why, as openpi's server tells it; the others go on
                self.failures += 1
                log.exception("a request from %s failed; closing that connection (1011)", ws.remote_address)
                await ws.send(traceback.format_exc())
                await ws.close(CLOSE_INTERNAL_ERROR, CLOSE_REASON)
                return
            try:
                await ws.send(codec.packb(answer))
            except ConnectionClosed:
                return
            self.answers += 1


def _http(connection: ServerConnection, request: Request) -> Response | None:
    if request.path == "/healthz":
        return connection.respond(http.HTTPStatus.OK, "OK\n")
    return None


# -- command line ----------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=SERVER_NAME,
        description="Serve an RLlib checkpoint's policy (no exploration) to bridges in mode: deploy, "
        "as an openpi-compatible websocket policy server.",
    )
    p.add_argument("--rllib", required=True, metavar="CHECKPOINT", help="an RLlib Algorithm checkpoint folder")
    p.add_argument(
        "--config",
        required=True,
        metavar="PARAMS_FILE",
        help="the bridge's params file: its policy.observations say which request key holds each state and image; "
        "its observations and actions are checked against the checkpoint",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (default %(default)s)")
    p.add_argument(
        "--horizon",
        type=int,
        default=None,
        help="H, steps per chunk (default: the checkpoint's action width over the sinks' width per step)",
    )
    p.add_argument("--module-id", default="default_policy", help="the RLModule to serve (default %(default)s)")
    add_access_options(p)
    return p


async def _serve_until_stopped(server: RLlibPolicyServer) -> int:
    try:
        port = await server.start()
    except AccessError as exc:
        print(f"{SERVER_NAME}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"{SERVER_NAME}: cannot listen on {server.host}:{server.port}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    chunks = server.reader.chunks
    host = f"[{server.host}]" if ":" in server.host else server.host
    print(f"serving {server.policy.parts.root} (H = {chunks.horizon}, action_dim = {chunks.action_dim})", flush=True)
    print(f"listening on {server.access.scheme}://{host}:{port}", flush=True)
    await stop.wait()
    await server.close()
    print(f"stopped: {server.answers} answers, {server.failures} failed requests", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGINT or SIGTERM, then exit 0; 2 for a checkpoint or params file it cannot serve."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.horizon is not None and args.horizon < 1:
        parser.error(f"--horizon: got {args.horizon}; steps per chunk, at least 1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("ray", "ray.rllib"):
        logging.getLogger(name).setLevel(logging.ERROR)  # RLlib's notices on loading are not the operator's
    from plugrl_ros.params.section import ConfigError
    from plugrl_ros.rllib.checkpoint_policy import CheckpointError, load_checkpoint_policy
    from plugrl_ros.rllib.request_reader import ConfigMismatch, RequestReader

    try:
        policy = load_checkpoint_policy(args.rllib, args.module_id)
        spaces = policy.observation_space, policy.action_space
        reader = RequestReader.from_params_file(args.config, *spaces, args.horizon)
    except (CheckpointError, ConfigMismatch, ConfigError) as exc:
        print(f"{SERVER_NAME}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    server = RLlibPolicyServer(policy, reader, access_from(args), args.host, args.port)
    try:
        return asyncio.run(_serve_until_stopped(server))
    except KeyboardInterrupt:
        return 130  # interrupted before the signal handlers were installed


if __name__ == "__main__":
    sys.exit(main())
