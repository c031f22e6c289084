"""RLlib SAC through PlugRLEnvRunner with the demo robots and a real bridge: the robots keep acting while it learns.

Real processes: the demo robot node and a bridge configured by the shipped
config/demo.yaml; SAC (the demo's config, :mod:`plugrl_ros.rllib.demo_sac`,
with a short warm-up and small batches) in this process. A smoke run, a few
hundred RL steps: the learning itself is the demo's (docs/rllib.md).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from harness import ROOT, process, python_module
from rllib_client import connected, make_runner, run, sampling

from plugrl_ros.rllib import PlugRLEnvRunner

pytestmark = [pytest.mark.rllib, pytest.mark.ros, pytest.mark.websockets]

from ray.rllib.callbacks.callbacks import RLlibCallback  # noqa: E402
from ray.rllib.core.columns import Columns  # noqa: E402
from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer  # noqa: E402

DEMO = ROOT / "config" / "demo.yaml"
STEPS = 300  # RL steps sampled before the run ends
RUN_LIMIT_S = 240.0  # a hang guard, not a timing claim


class BetweenSamples(PlugRLEnvRunner):
    """The runner, counting the answers it sends between ``sample()`` calls (while the learner updates)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.answers_between_samples = 0
        self._answers_at_return: int | None = None

    def sample(self, **kwargs: Any) -> list:
        if self._answers_at_return is not None:
            self.answers_between_samples += self.figures.answers_sent - self._answers_at_return
        try:
            return super().sample(**kwargs)
        finally:
            self._answers_at_return = self.figures.answers_sent


def test_a_robot_episode_that_runs_from_a_random_warm_up_into_the_policy_reaches_the_replay_buffer_whole():
    """sample(random_actions=True) then sample(): the running episode's steps differ in model outputs, which
    RLlib's replay buffer refuses to join; the runner continues it in a new episode from the same observation."""
    r = make_runner()

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=1, random_actions=True)
        await client.infer([0], [[0.0] * 3])
        await client.feedback([0], [[1.0] * 3], [1.0])
        warm_up = await sample
        sample = await sampling(r, num_timesteps=2)
        for k in range(2):
            await client.infer([0], [], reuse=[True])
            await client.feedback([0], [[k + 2.0] * 3], [1.0], terminated=[k == 1])
        learning = await sample
        metrics = r.get_metrics()
        await client.ws.close()
        return warm_up, learning, metrics

    try:
        warm_up, learning, metrics = run(scenario)
    finally:
        r.stop()
    (random,) = warm_up
    (policy,) = [e for e in learning if len(e) > 0]
    assert Columns.ACTION_LOGP not in random.extra_model_outputs and Columns.ACTION_LOGP in policy.extra_model_outputs
    # the policy's episode starts where the random one stopped (left unterminated: bootstrapped)
    assert policy.id_ != random.id_ and not random.is_done and policy.is_terminated
    assert policy.get_observations(0).tolist() == random.get_observations(-1).tolist() == [1.0] * 3
    buffer = EpisodeReplayBuffer(capacity=100)
    buffer.add(warm_up)
    buffer.add(learning)  # RLlib's buffer joins chunks by episode id: it would fail on mixed model outputs
    assert buffer.get_num_timesteps() == 3
    assert float(metrics["num_episodes"]) == 1 and float(metrics["episode_len_mean"]) == 3  # one robot episode


@pytest.mark.slow
def test_sac_learns_from_robots_that_the_runner_serves_through_its_updates_and_its_weights_reach_the_runner(
    tmp_path,
):
    """With demonstrations in its replay buffer: a quarter of every batch (test_rllib_offline checks the share)."""
    import ray
    from test_rllib_offline import write_demonstrations

    from plugrl_ros.rllib.demo_sac import sac_demo_config
    from plugrl_ros.rllib.demonstrations import with_demonstrations

    ended: list[float] = []

    class EpisodeEnds(RLlibCallback):
        def on_episode_end(self, *, episode, **kwargs) -> None:
            ended.append(float(episode.get_return()))

    demonstration_steps = write_demonstrations(tmp_path)
    config = (
        sac_demo_config(DEMO, port=0)
        .env_runners(env_runner_cls=BetweenSamples)
        .training(
            num_steps_sampled_before_learning_starts=100,
            train_batch_size_per_learner=32,
        )
        .callbacks(EpisodeEnds, on_algorithm_init=with_demonstrations([tmp_path], share=0.25))
        .reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=50)
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        algo = config.build_algo()
        assert algo.local_replay_buffer.demonstration_steps == demonstration_steps
        runner: BetweenSamples = algo.env_runner
        initial = _weights(runner.module.get_state())
        bridge = python_module(
            "plugrl_ros.node.bridge_main",
            *("--ros-args", "--params-file", str(DEMO), "-p", f"trainer.uri:=ws://127.0.0.1:{runner.port}"),
            *("-p", "envs:=['reacher0', 'reacher1']"),
        )
        robot = python_module("plugrl_ros.demo.robot_node", "--envs", "2", "--image-size", "16")
        with process(robot), process(bridge) as bridged:
            try:
                results = []
                deadline = time.monotonic() + RUN_LIMIT_S
                while _sampled(results) < STEPS and time.monotonic() < deadline:
                    results.append(algo.train())
                learner = algo.learner_group.get_weights()["default_policy"]
                demonstrations = algo.local_replay_buffer.demonstrations.get_num_timesteps()
                final = _weights(runner.module.get_state())
                weights_seq_no = runner.get_state()["weights_seq_no"]
                algo.stop()  # the run's end: the bridge exits 0
                code = bridged.wait(60)
            finally:
                print(bridged.output()[-3000:])
    finally:
        ray.shutdown()
    assert _sampled(results) >= STEPS, results[-1] if results else "no iteration"
    assert code == 0
    # the learner updated: the runner's policy is no longer the initial one, and it is the learner's
    assert any(not np.array_equal(initial[key], final[key]) for key in final)
    for key, value in final.items():
        assert np.allclose(value, np.asarray(learner[key])), key
    assert weights_seq_no > 0
    assert demonstrations == demonstration_steps  # the robots' episodes never evict the demonstrations
    # the robots were answered while the learner updated, not only inside sample()
    assert runner.answers_between_samples > 0
    # every robot episode that ended was the callbacks' too, with the runner's own return
    assert ended and len(ended) == len(runner.episode_log)


def _weights(state: dict) -> dict[str, np.ndarray]:
    return {key: np.asarray(value).copy() for key, value in state.items()}


def _sampled(results: list[dict]) -> int:
    return int(results[-1]["env_runners"]["num_env_steps_sampled_lifetime"]) if results else 0
