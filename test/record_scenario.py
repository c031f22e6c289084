"""A deterministic synthetic run for recorder tests: 3 envs, chunks, steps, episodes, a reconnect that drops a chunk.

Shared by the round-trip tests and the child process the SIGKILL test kills.
Values follow the probe's pattern (action ``10000*k + 10*env + dim``) so a
misplaced value shows where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plugrl_ros.protocol.messages import ObservationRow

ENVS = 3
H = 3
DA = 2
IMAGE_SHAPE = (6, 8, 3)


@dataclass
class Call:
    method: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


def _obs(env: int, t: int, episode: int) -> ObservationRow:
    image = np.full(IMAGE_SHAPE, (env * 40 + t) % 256, dtype=np.uint8)
    image[0, 0] = [env, episode, t % 256]
    return ObservationRow(
        images={"cam": image},
        states={"q": np.array([t / 7.0, env + 0.5], dtype=np.float64), "t": np.array([float(t)])},
        text=f"env {env}",
    )


def episode_length(env: int) -> int:
    return 3 + 2 * (env % 3)


def scenario(episodes: int = 2) -> list[Call]:
    """The calls of the run, in the order the node would make them."""
    calls: list[Call] = [
        Call("config", (1_000, {"control.rate_hz": 50.0, "envs.count": ENVS}, {"plugrl_ros": "0.1.0"})),
        Call("link_event", (1_100, "connect", 1)),
        Call("link_event", (1_200, "metadata", 1), {"detail": {"action_horizon": H, "action_dim": DA}}),
    ]
    t = 2_000_000
    # per env: a list of blocks (one chunk each), interleaved round-robin below
    blocks: dict[int, list[list[Call]]] = {e: [] for e in range(ENVS)}
    for env in range(ENVS):
        for ep in range(episodes):
            steps_done, k, ret = 0, 0, 0.0
            length = episode_length(env)
            while steps_done < length:
                block: list[Call] = []
                block.append(Call("observation", (env, 0, _obs(env, steps_done, ep), "infer")))
                action = np.array(
                    [[10000 * (k + j) + 10 * env + d + ep * 0.5 for d in range(DA)] for j in range(H)], dtype=np.float32
                )
                block.append(Call("chunk", (env, 0, action)))
                block.append(Call("latency", (0, 0.01 + env * 0.001)))
                drop_here = env == 1 and ep == 1 and k == 0  # the reconnect: this chunk runs one step, then is lost
                run = 1 if drop_here else min(H, length - steps_done)
                for j in range(run):
                    commanded = {"arm": action[j].astype(np.float64) * 2.0, "gripper": None if j % 2 else np.array([j])}
                    block.append(Call("step", (env, 0, j, commanded)))
                    steps_done += 1
                    terminal = steps_done == length
                    reward = 1.0 + 0.25 * j
                    ret += reward
                    block.append(Call("step_result", (env, 0, reward, terminal, False, terminal and env == 2)))
                    if terminal:
                        block.append(Call("episode_end", (env, 0, ret, length, env == 2)))
                if drop_here:
                    close = {"code": 1001, "reason": "plugrl-server-resync", "dropped_envs": [1]}
                    block.append(Call("link_event", (0, "close", 1), close))
                    block.append(Call("link_event", (0, "connect", 2)))
                    block.append(Call("step", (env, 0, None, {"arm": np.zeros(DA), "gripper": None})))  # idle tick
                else:
                    block.append(Call("observation", (env, 0, _obs(env, steps_done, ep), "feedback")))
                k += run
                blocks[env].append(block)
    while any(blocks.values()):
        for env in range(ENVS):
            if blocks[env]:
                calls.extend(blocks[env].pop(0))
    # stamp every call with a strictly increasing time (the node's clock)
    for call in calls:
        t += 1_000_000
        call.args = _with_time(call, t)
    return calls


def _with_time(call: Call, t: int) -> tuple:
    args = list(call.args)
    index = 0 if call.method in ("config", "link_event", "latency") else 1
    args[index] = t
    return tuple(args)


def play(recorder: Any, calls: list[Call]) -> None:
    for call in calls:
        getattr(recorder, call.method)(*call.args, **call.kwargs)


def call_time(call: Call) -> int:
    return call.args[0] if call.method in ("config", "link_event", "latency") else call.args[1]
