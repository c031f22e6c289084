"""RLlib's episode and sample callbacks through PlugRLEnvRunner: called where RLlib's own runner calls them.

A scripted client plays a bridge over a real websocket; ``sample()`` runs on
a thread as Ray runs it. The user's callbacks are an ``RLlibCallback`` class
and callback functions, as users write them (``config.callbacks(...)``).
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("ray.rllib")

from rllib_client import connected, ppo_config, run, sampling

from plugrl_ros.protocol.messages import episode_info
from plugrl_ros.rllib import PlugRLEnvRunner

pytestmark = [pytest.mark.rllib, pytest.mark.ros, pytest.mark.websockets]

from ray.rllib.callbacks.callbacks import RLlibCallback  # noqa: E402


def recording_callbacks(calls: list[dict]) -> type[RLlibCallback]:
    """A callbacks class that records what each episode callback saw at the moment it was called, and logs a
    custom metric as RLlib users do."""

    def seen(name: str, kwargs: dict) -> None:
        episode = kwargs["episode"]
        calls.append(
            {
                "name": name,
                "keys": set(kwargs),
                "env_index": kwargs["env_index"],
                "env": kwargs["env"],
                "env_runner": kwargs["env_runner"],
                "metrics_logger": kwargs["metrics_logger"],
                "rl_module": kwargs["rl_module"],
                "id": episode.id_,
                "len": len(episode),
                "done": episode.is_done,
                "last_obs": episode.get_observations(-1).tolist() if episode.is_reset else None,
                "prev_chunks": [len(c) for c in kwargs.get("prev_episode_chunks", [])],
                "thread": threading.current_thread().name,
            }
        )

    class Recording(RLlibCallback):
        def on_episode_created(self, **kwargs) -> None:
            seen("on_episode_created", kwargs)

        def on_episode_start(self, **kwargs) -> None:
            seen("on_episode_start", kwargs)

        def on_episode_step(self, *, episode, metrics_logger, **kwargs) -> None:
            seen("on_episode_step", dict(kwargs, episode=episode, metrics_logger=metrics_logger))
            metrics_logger.log_value("custom_last_reward", float(episode.get_rewards(-1)), window=1)

        def on_episode_end(self, **kwargs) -> None:
            seen("on_episode_end", kwargs)

        def on_sample_end(self, *, env_runner, metrics_logger, samples, **kwargs) -> None:
            calls.append({"name": "on_sample_end", "steps": sum(len(e) for e in samples), "runner": env_runner})

    return Recording


def test_episode_callbacks_are_called_where_rllibs_runner_calls_them_with_its_arguments():
    calls: list[dict] = []
    functions: list[int] = []
    config = ppo_config().callbacks(
        recording_callbacks(calls), on_episode_end=lambda *, episode, **kwargs: functions.append(len(episode))
    )
    r = PlugRLEnvRunner(config=config)

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=3)
        await client.infer([0, 1], [[0.0] * 3, [1.0] * 3])
        ended = episode_info([False, True], [0.0, 2.0], [0, 1], [False, True])
        await client.feedback([0, 1], [[0.5] * 3, [1.5] * 3], [1.0, 2.0], [False, True], info=ended)
        await client.infer([0], [], reuse=[True])
        await client.feedback([0], [[0.7] * 3], [3.0])
        first = await sample
        sample = await sampling(r, num_timesteps=1)
        await client.infer([0], [], reuse=[True])
        ended = episode_info([True], [7.0], [3], [False])
        await client.feedback([0], [[0.9] * 3], [3.0], truncated=[True], info=ended)
        second = await sample
        metrics = r.get_metrics()
        await client.ws.close()
        return first, second, metrics

    try:
        first, second, metrics = run(scenario)
    finally:
        r.stop()
    episode_calls = [c for c in calls if c["name"] != "on_sample_end"]
    # the order of RLlib's runner: created (empty) -> start (after reset) -> step per step -> end after its step
    assert [(c["name"], c["env_index"], c["len"]) for c in episode_calls] == [
        ("on_episode_created", 0, 0),
        ("on_episode_created", 1, 0),
        ("on_episode_start", 0, 0),
        ("on_episode_start", 1, 0),
        ("on_episode_step", 0, 1),
        ("on_episode_step", 1, 1),
        ("on_episode_end", 1, 1),
        ("on_episode_step", 0, 2),
        ("on_episode_step", 0, 1),  # the second sample's chunk of env 0's episode (cut at the first's end)
        ("on_episode_end", 0, 1),
    ]
    # RLlib's keyword arguments; what a remote robot cannot give is None (env), env_index is the robot's on its bridge
    rllib_keys = {"episode", "env_runner", "metrics_logger", "env", "rl_module", "env_index"}
    for c in episode_calls:
        expected = rllib_keys | ({"prev_episode_chunks"} if c["name"] == "on_episode_end" else set())
        assert c["keys"] == expected, c
        assert c["env"] is None and c["env_runner"] is r and c["metrics_logger"] is r.metrics
        assert c["rl_module"] is r.module
    # start and step see the observation after the env-to-module connectors (flattened), the terminal one too
    start, step, end = (next(c for c in episode_calls if c["name"] == n and c["env_index"] == 1) for n in
                        ("on_episode_start", "on_episode_step", "on_episode_end"))  # fmt: skip
    assert start["last_obs"] == [1.0] * 3 and step["last_obs"] == [1.5] * 3 and end["done"]
    assert start["id"] == step["id"] == end["id"] and end["prev_chunks"] == []
    # an episode that spans samples: its end gets the chunks sample() returned before
    last = episode_calls[-1]
    assert last["done"] and last["prev_chunks"] == [2] and last["id"] in {e.id_ for e in first}
    assert functions == [1, 1]  # callback functions are called as well, at the same points
    # a feedback is handled where it is read, on the runner's websocket thread: no hand-over to sample()'s thread
    assert {c["thread"] for c in episode_calls if c["name"] in ("on_episode_step", "on_episode_end")} == {
        "plugrl-rllib-link"
    }
    # on_sample_end once per sample() call, with what it returns
    assert [(c["steps"], c["runner"]) for c in calls if c["name"] == "on_sample_end"] == [(3, r), (1, r)]
    assert sum(len(e) for e in second) == 1
    # a custom metric logged from a callback reaches the runner's results
    assert float(metrics["custom_last_reward"]) == 3.0


def test_a_callback_that_raises_closes_only_that_bridges_connection_and_the_runner_serves_on(caplog):
    class Failing(RLlibCallback):
        def on_episode_step(self, *, episode, **kwargs) -> None:
            if episode.get_rewards(-1) < 0:
                raise RuntimeError("the user's callback cannot handle a negative reward")

    r = PlugRLEnvRunner(config=ppo_config().callbacks(Failing))

    async def scenario():
        good, bad = await connected(r.port), await connected(r.port)
        sample = await sampling(r, num_timesteps=2)
        await bad.infer([0], [[0.0] * 3])
        await bad.feedback([0], [[1.0] * 3], [-1.0])
        bad_close = await bad.closed()
        for k in range(2):
            await good.infer([0], [[float(k)] * 3])
            await good.feedback([0], [[k + 1.0] * 3], [1.0])
        episodes = await sample
        await good.ws.close()
        return bad_close, episodes

    try:
        bad_close, episodes = run(scenario)
    finally:
        r.stop()
    assert bad_close is not None and bad_close[0] == 1001
    assert [len(e) for e in episodes] == [2]
    assert any("FedBack failed" in record.getMessage() and record.exc_info for record in caplog.records)
