"""``plugrl-policy-server``: a trained policy served as openpi serves one, whatever trained it.

The contract is openpi's ``WebsocketPolicyServer``, the one the bridge's
``mode: deploy`` speaks (and openpi's own ``WebsocketClientPolicy``): on each
connection the server first sends a metadata map (``action_horizon``,
``action_dim``, what it serves); then every binary msgpack frame is one
robot's observation, answered with ``{"actions": float32 [H, action_dim],
"server_timing": {...}}``. A request that fails is answered, as openpi's server
does, with its traceback in a text frame and a close with 1011; the bridge
logs it, idles that robot and reconnects. ``GET /healthz`` answers 200.

This module holds the server, the command line and the run; the backends
load a policy and say how it acts: ``--rllib CHECKPOINT``
(:mod:`plugrl_ros.rllib.policy_server`) and ``--sb3 MODEL.zip``
(:mod:`plugrl_ros.sb3.policy_server`) and ``--lerobot PRETRAINED_DIR``
(:mod:`plugrl_ros.lerobot_policy.policy_server`). Every backend listens through
:func:`~plugrl_ros.tools.serving.serve_trainer`, so behind the package's one
access gate (API key, TLS). Which request key holds which state or image
comes from the bridge's own params file
(:class:`~plugrl_ros.serve.request_reader.RequestReader`). This module imports
no backend: the light entry point (:mod:`plugrl_ros.tools.policy_server`) reads
the command line before an extra is imported.
"""

from __future__ import annotations

import argparse
import asyncio
import http
import logging
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from websockets.asyncio.server import Request, Response, Server, ServerConnection
from websockets.exceptions import ConnectionClosed

from plugrl_ros import __version__
from plugrl_ros.protocol import codec
from plugrl_ros.protocol.server_auth import AccessError, ServerAccess
from plugrl_ros.tools.serving import access_from, add_access_options, serve_trainer

log = logging.getLogger("plugrl_ros.policy_server")

SERVER_NAME = "plugrl-policy-server"
ACTION_KEY = "actions"
CLOSE_INTERNAL_ERROR = 1011
CLOSE_REASON = "Internal server error. Traceback included in previous frame."
EXIT_BAD_INPUT = 2


@dataclass(frozen=True)
class LoadedPolicy:
    """What a backend loaded: how it acts on one request, and what the bridges and the operator are told."""

    act: Callable[[Any], np.ndarray]  # a decoded request -> the chunk, float32 [H, action_dim]
    horizon: int
    action_dim: int
    policy: str  # what the metadata's "policy" says it is
    source: str  # the checkpoint or model it came from
    # for a policy that keeps a history of its robot's observations: a fresh ``act`` for each connection
    connect: Callable[[], Callable[[Any], np.ndarray]] | None = None


class PolicyServer:
    """Serves one loaded policy to any number of robots.

    Requests are answered one at a time, in the event loop (a robot's
    observation through a small network takes about a millisecond).
    """

    def __init__(self, loaded: LoadedPolicy, access: ServerAccess, host: str = "127.0.0.1", port: int = 0) -> None:
        """``access``: the API key every handshake must carry and the certificate for ``wss://``."""
        self.loaded = loaded
        self.access = access
        self.host = host
        self.port = port
        self.answers = 0
        self.failures = 0
        self._server: Server | None = None

    def metadata(self) -> dict[str, Any]:
        return {
            "server": SERVER_NAME,
            "server_version": __version__,
            "policy": self.loaded.policy,
            "checkpoint": self.loaded.source,
            "action_horizon": self.loaded.horizon,
            "action_dim": self.loaded.action_dim,
        }

    def answer(self, request: Any, act: Callable[[Any], np.ndarray]) -> dict[str, Any]:
        """The answer of ``act`` (the connection's) to one decoded request (raises on a request unlike the
        policy's observations)."""
        started = time.perf_counter()
        actions = act(request)
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
        act = self.loaded.connect() if self.loaded.connect is not None else self.loaded.act
        while True:
            try:
                frame = await ws.recv()
            except ConnectionClosed:
                return
            try:
                if isinstance(frame, str):
                    raise TypeError("expected a binary msgpack frame holding an observation, got a text frame")
                answer = self.answer(codec.unpackb(frame), act)
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


def parser() -> argparse.ArgumentParser:
    """The command line of every backend (no backend is imported to build it)."""
    p = argparse.ArgumentParser(
        prog=SERVER_NAME,
        description="Serve a trained policy (no exploration) to bridges in mode: deploy, as an openpi-compatible "
        "websocket policy server: an RLlib checkpoint (--rllib, the rllib extra), a Stable-Baselines3 model "
        "(--sb3, the sb3 extra) or a LeRobot policy (--lerobot, the lerobot-policy extra).",
    )
    backend = p.add_mutually_exclusive_group(required=True)
    backend.add_argument("--rllib", metavar="CHECKPOINT", help="an RLlib Algorithm checkpoint folder")
    backend.add_argument(
        "--sb3", metavar="MODEL_ZIP", help="a Stable-Baselines3 model (model.save's .zip) trained on RobotVecEnv"
    )
    backend.add_argument(
        "--lerobot",
        metavar="PRETRAINED_DIR",
        help="a LeRobot policy's folder (lerobot-train's checkpoints/.../pretrained_model: ACT, Diffusion Policy, ...)",
    )
    p.add_argument(
        "--config",
        required=True,
        nargs="+",
        metavar="PARAMS_FILE",
        help="the bridge's params file (or files, in its --params-file order: a later file's value wins): its "
        "policy.observations say which request key holds each state and image; its observations and actions are "
        "checked against the policy",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (default %(default)s)")
    p.add_argument(
        "--horizon",
        type=int,
        default=None,
        help="H, steps per chunk (default: the policy's action width over the sinks' width per step; --lerobot: the "
        "policy's n_action_steps)",
    )
    p.add_argument("--module-id", default="default_policy", help="--rllib: the RLModule to serve (default %(default)s)")
    p.add_argument(
        "--algorithm",
        default=None,
        metavar="NAME",
        help="--sb3: the model's algorithm, PPO, SAC, TD3, A2C or DDPG (default: read from the model file)",
    )
    add_access_options(p)
    return p


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.horizon is not None and args.horizon < 1:
        p.error(f"--horizon: got {args.horizon}; steps per chunk, at least 1")
    if len(args.config) == 1:
        (args.config,) = args.config  # one file: named as given in what the server says of it
    return args


async def serve_until_stopped(server: PolicyServer) -> int:
    """Listen and answer until SIGINT or SIGTERM; 0, or 2 if it cannot listen."""
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
    loaded = server.loaded
    host = f"[{server.host}]" if ":" in server.host else server.host
    print(f"serving {loaded.source} (H = {loaded.horizon}, action_dim = {loaded.action_dim})", flush=True)
    print(f"listening on {server.access.scheme}://{host}:{port}", flush=True)
    await stop.wait()
    await server.close()
    print(f"stopped: {server.answers} answers, {server.failures} failed requests", flush=True)
    return 0


def run(loaded: LoadedPolicy, access: ServerAccess, host: str, port: int) -> int:
    """Serve ``loaded`` until SIGINT or SIGTERM, then 0."""
    try:
        return asyncio.run(serve_until_stopped(PolicyServer(loaded, access, host, port)))
    except KeyboardInterrupt:
        return 130  # interrupted before the signal handlers were installed


def load_and_serve(
    args: argparse.Namespace,
    load: Callable[[argparse.Namespace], LoadedPolicy],
    refused: tuple[type[Exception], ...],
) -> int:
    """A backend's run: ``load`` the policy the command line names, then serve it; 2, saying why, if ``load``
    raises one of ``refused`` (a policy or params file it cannot serve)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        loaded = load(args)
    except refused as exc:
        print(f"{SERVER_NAME}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return run(loaded, access_from(args), args.host, args.port)
