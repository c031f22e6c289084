"""A minimal, fast PlugRL trainer for benchmarks: answers every infer at once and counts what crosses the wire.

Run: ``python bench/bench_trainer.py [--port 0] [--horizon 4] [--action-dim 2] [--reuse]``.

It prints ``PORT <n>`` once listening, then one JSON line of cumulative
counters every ``--stats-interval`` seconds (and a last one on SIGINT), so a
benchmark can take the difference over a steady-state window. Each
connection's protocol rules are the package's trainer-side core
(:class:`TrainerConnection`, strict: a broken rule closes the connection for
a resync), without the observations' layout checks: a benchmark's trainer
shares the machine with the client, and its cost must stay small
(``plugrl-test-trainer`` is the protocol checker).

Env steps are counted from the feedbacks: with the probe environment's
``states.t`` (steps taken this episode) exactly, as ``t`` after the chunk
minus ``t`` before it; otherwise as ``horizon`` per fed-back row (chunks run
whole unless an episode ends).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from plugrl_ros.protocol.client import RESYNC_REASON
from plugrl_ros.protocol.codec import packb
from plugrl_ros.protocol.messages import REUSE_FEEDBACK_OBS
from plugrl_ros.protocol.server_messages import Infer, Resync, build_action
from plugrl_ros.protocol.trainer_connection import TrainerConnection
from plugrl_ros.tools.serving import serve_trainer


def ws_overhead(payload: int) -> int:
    """Bytes a client frame adds to its payload: header, extended length, 4-byte mask."""
    return 2 + (0 if payload < 126 else 2 if payload < 65536 else 8) + 4


class Counters:
    def __init__(self) -> None:
        self.values = {
            "connections": 0,
            "infers": 0,
            "feedbacks": 0,
            "infer_rows": 0,
            "infer_data_rows": 0,
            "feedback_rows": 0,
            "steps": 0,
            "bytes_in": 0,
            "bytes_out": 0,
        }

    def add(self, key: str, value: int) -> None:
        self.values[key] += value

    def line(self) -> str:
        return json.dumps({"t": time.monotonic(), **self.values})


class BenchTrainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.counters = Counters()
        self.metadata: dict[str, Any] = {
            "protocol_version": 1,
            "server": "plugrl-bench-trainer",
            "action_horizon": args.horizon,
            "action_dim": args.action_dim,
            "features": [REUSE_FEEDBACK_OBS] if args.reuse else [],
        }
        self._actions: dict[tuple[int, ...], bytes] = {}

    def action_frame(self, env_ids: tuple[int, ...]) -> bytes:
        # Answers depend only on the env ids (values are the probe's 10000*k + 10*env + dim).
        frame = self._actions.get(env_ids)
        if frame is None:
            h, d = self.args.horizon, self.args.action_dim
            k, e, j = np.meshgrid(np.arange(h), np.asarray(env_ids), np.arange(d), indexing="ij")
            action = (10000.0 * k + 10.0 * e + j).astype("<f4")
            frame = packb(build_action(env_ids, action))
            if len(self._actions) > 4096:
                self._actions.clear()
            self._actions[env_ids] = frame
        return frame

    async def handle(self, ws: ServerConnection) -> None:
        c = self.counters
        c.add("connections", 1)
        conn = TrainerConnection(strict=True, check_observations=False)
        start_t: dict[int, float] = {}  # env -> probe t at the start of its chunk
        last_t: dict[int, float] = {}  # env -> probe t of its last non-terminal feedback
        metadata_frame = packb(conn.send_metadata(self.metadata))
        await ws.send(metadata_frame)
        c.add("bytes_out", len(metadata_frame))
        try:
            async for frame in ws:
                c.add("bytes_in", len(frame) + ws_overhead(len(frame)))
                message = conn.receive(frame)
                envs = message.env_indices
                if isinstance(message, Infer):
                    c.add("infers", 1)
                    c.add("infer_rows", len(envs))
                    reused = message.reuse or (False,) * len(envs)
                    t = _probe_t(message.observation.data)
                    c.add("infer_data_rows", len(envs) - sum(reused))
                    rows = iter(t) if t is not None else None
                    for env, r in zip(envs, reused):
                        if rows is None:
                            continue
                        start_t[env] = last_t[env] if r else next(rows)
                    reply = self.action_frame(conn.answered())
                    await ws.send(reply)
                    c.add("bytes_out", len(reply))
                else:
                    c.add("feedbacks", 1)
                    c.add("feedback_rows", len(envs))
                    t = _probe_t(message.observation.data)
                    if t is None:
                        c.add("steps", self.args.horizon * len(envs))
                        continue
                    for env, t_now, end in zip(envs, t, message.ended.tolist()):
                        c.add("steps", round(t_now - start_t.get(env, 0.0)))
                        last_t[env] = t_now
                        if end:
                            last_t.pop(env, None)
        except Resync as exc:
            print(f"bench-trainer: the client broke a protocol rule ({exc}); resync", file=sys.stderr, flush=True)
            await ws.close(1001, RESYNC_REASON)
        except ConnectionClosed:
            pass

    async def run(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        serving = serve_trainer(self.handle, self.args.host, self.args.port, close_timeout=5.0, access=None)
        async with await serving as server:
            port = next(iter(server.sockets)).getsockname()[1]
            print(f"PORT {port}", flush=True)
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), self.args.stats_interval)
                except asyncio.TimeoutError:
                    pass
                print(self.counters.line(), flush=True)


def _probe_t(obs: Any) -> list[float] | None:
    states = obs.get("states") if isinstance(obs, dict) else None
    t = states.get("t") if isinstance(states, dict) else None
    return None if t is None else t.reshape(-1).tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--horizon", type=int, default=4)
    parser.add_argument("--action-dim", type=int, default=2)
    parser.add_argument("--reuse", action="store_true", help="offer the reuse-feedback-obs feature")
    parser.add_argument("--stats-interval", type=float, default=0.25)
    asyncio.run(BenchTrainer(parser.parse_args()).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
