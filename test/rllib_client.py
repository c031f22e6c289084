"""Test helpers for plugrl_ros.rllib: a runner built from a small PPO config, and a scripted PlugRL client."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.connectors.env_to_module import FlattenObservations
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from plugrl_ros.protocol.codec import packb, unpackb
from plugrl_ros.rllib import PlugRLEnvRunner, RunnerSettings

WAIT_S = 30.0  # a hang guard, not a timing claim
STATE_DIM = 3
ACTION_LOW, ACTION_HIGH = -2.0, 2.0


def observation_space(dim: int = STATE_DIM) -> gym.spaces.Dict:
    box = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)
    return gym.spaces.Dict({"states": gym.spaces.Dict({"obs": box})})


POISON = 666.0  # an observation value that FailOnPoison's connector fails on


class FailOnPoison(ConnectorV2):
    """An env-to-module connector that raises on an observation holding POISON: a user's connector failing."""

    def __call__(self, *, rl_module: Any, batch: Any, episodes: list, **kwargs: Any) -> Any:
        for episode in episodes:
            if np.any(episode.get_observations(-1)["states"]["obs"] == POISON):
                raise RuntimeError("the connector cannot handle this observation")
        return batch


def ppo_config(horizon: int = 1, action_dim: int = 2, poison: bool = False, **runner: Any) -> PPOConfig:
    """PPO for robots with one 3-value state ``obs`` and ``action_dim`` actions in [-2, 2], H steps per chunk.

    ``poison``: a connector that fails on observations holding :data:`POISON` comes first.
    """
    settings = RunnerSettings(**{"port": 0, "horizon": horizon, "sample_wait_s": 5.0, **runner})
    first = [FailOnPoison()] if poison else []
    action_space = gym.spaces.Box(ACTION_LOW, ACTION_HIGH, (horizon * action_dim,), np.float32)
    return (
        PPOConfig()
        .environment(observation_space=observation_space(), action_space=action_space, env_config=settings.env_config())
        .env_runners(
            env_runner_cls=PlugRLEnvRunner,
            num_env_runners=0,
            sample_timeout_s=60.0,
            env_to_module_connector=lambda env, spaces, device: [*first, FlattenObservations()],
        )
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[16]))
        .debugging(seed=0)
    )


def make_runner(horizon: int = 1, action_dim: int = 2, poison: bool = False, **runner: Any) -> PlugRLEnvRunner:
    return PlugRLEnvRunner(config=ppo_config(horizon, action_dim, poison, **runner))


def states(values: list[list[float]]) -> dict:
    """An observation of these rows of ``obs`` (and a camera and text the policy does not read)."""
    n = len(values)
    return {
        "images": {"camera": np.zeros((n, 2, 2, 3), np.uint8)},
        "states": {"obs": np.asarray(values, dtype="<f8").reshape(n, -1)},
        "text": np.asarray(["go"] * n),
    }


class Client:
    """One bridge's connection, scripted message by message."""

    def __init__(self, ws: ClientConnection, metadata: dict) -> None:
        self.ws = ws
        self.metadata = metadata

    async def send_infer(self, envs: list[int], rows: list[list[float]], reuse: list[bool] | None = None) -> None:
        message = {
            "message_type": "infer",
            "data": states(rows) if rows else _empty(),  # every row reused: data has none
            "env_indices": np.asarray(envs, dtype="<i8"),
            "step_ids": np.zeros(len(envs), dtype="<i8"),
        }
        if reuse is not None:
            message["reuse"] = np.asarray(reuse, dtype=bool)
        await self.ws.send(packb(message))

    async def action(self, envs: list[int]) -> np.ndarray:
        reply = unpackb(await asyncio.wait_for(self.ws.recv(), WAIT_S))
        assert reply["message_type"] == "action"
        assert reply["data"]["env_ids"].tolist() == envs
        return reply["data"]["action"]

    async def infer(self, envs: list[int], rows: list[list[float]], reuse: list[bool] | None = None) -> np.ndarray:
        await self.send_infer(envs, rows, reuse)
        return await self.action(envs)

    async def feedback(
        self,
        envs: list[int],
        rows: list[list[float]],
        rewards: list[float],
        terminated: list[bool] | None = None,
        truncated: list[bool] | None = None,
        info: dict | None = None,
    ) -> None:
        m = len(envs)
        data = {
            "obs": states(rows),
            "rewards": np.asarray(rewards, dtype="<f4"),
            "terminated": np.asarray(terminated or [False] * m, dtype=bool),
            "truncated": np.asarray(truncated or [False] * m, dtype=bool),
            "info": info or {},
        }
        message = {"message_type": "feedback", "env_indices": np.asarray(envs, "<i8"), "step_ids": np.zeros(m, "<i8")}
        await self.ws.send(packb({**message, "data": data}))

    async def closed(self, timeout: float = WAIT_S) -> tuple[int, str] | None:
        """How the server closed this connection (None: it sent something instead)."""
        try:
            await asyncio.wait_for(self.ws.recv(), timeout)
        except ConnectionClosed as exc:
            return (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd else (1006, "")
        return None


def _empty() -> dict:
    return {"images": {"camera": np.zeros((0, 2, 2, 3), np.uint8)}, "states": {"obs": np.zeros((0, 3))}, "text": []}


async def connected(port: int) -> Client:
    ws = await connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None)
    metadata = unpackb(await asyncio.wait_for(ws.recv(), WAIT_S))
    assert metadata["message_type"] == "metadata"
    return Client(ws, metadata["data"])


async def sampling(runner: PlugRLEnvRunner, **kwargs: Any) -> asyncio.Future:
    """``runner.sample(**kwargs)`` on a thread, as Ray calls it on the actor's."""
    return asyncio.get_running_loop().run_in_executor(None, functools.partial(runner.sample, **kwargs))


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), 4 * WAIT_S))
