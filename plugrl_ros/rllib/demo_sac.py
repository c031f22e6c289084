"""``plugrl-demo --trainer rllib --algorithm SAC``: RLlib's SAC trains the demo reachers while they keep acting.

The same robots, bridge config and runner as the PPO demo
(:mod:`plugrl_ros.rllib.demo`), with the settings a robot stepping in real
time needs from an off-policy learner: the runner answers the robots
through every learner update (``serve_during_updates``), so
the robots never wait for the learner; ``sample()`` hands the learner what
they did since its last call; the replay buffer (on the learner's side) keeps
every step. docs/rllib.md ("SAC on a robot stepping in real time") explains
each setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HORIZON = 1  # one RL step per control step: SAC's squashed Gaussian per action
# The return the demo shows is the bridge's, per robot episode; the learner's discount per step:
GAMMA = 0.9  # episodes last 60 steps at most; what matters is getting to the target within a second or two
WARM_UP_STEPS = 500  # RL steps from the initial (near-uniform) policy before the first update
# Transitions replayed per update. RLlib's episode replay buffer and learner connectors cost about as much CPU per
# transition as the networks (measured: 78 ms of CPU per update at 64, 195 ms at 256, with [64, 64] networks):
# small batches mean many more updates in the same time, which this short demo needs.
BATCH = 64
SECONDS_PER_ITERATION = 5.0  # one progress line in the trainer's log per 5 s of training


def local_sac(
    spaces: Any,
    runner: Any,
    *,
    training: dict[str, Any],
    hidden: list[int],
    seed: int,
    sample_timeout_s: float,
    runner_cls: type | None = None,
) -> Any:
    """RLlib SAC whose one EnvRunner is a PlugRL runner in this process (``runner_cls``, by default
    :class:`PlugRLEnvRunner`, with the ``RunnerSettings`` ``runner``), for the robots ``spaces``
    (:func:`robot_spaces`) describe: flattened observations, SAC's ``training`` settings, MLPs of ``hidden``
    layers for the policy and the Q networks."""
    from ray.rllib.algorithms.sac import SACConfig
    from ray.rllib.connectors.env_to_module import FlattenObservations
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from plugrl_ros.rllib import PlugRLEnvRunner

    return (
        SACConfig()
        .environment(
            observation_space=spaces.observation_space,
            action_space=spaces.action_space,
            env_config=runner.env_config(),
        )
        .env_runners(
            env_runner_cls=runner_cls or PlugRLEnvRunner,
            num_env_runners=0,
            sample_timeout_s=sample_timeout_s,
            # no MeanStdFilter: replayed observations would be normalised by statistics that moved since
            env_to_module_connector=lambda env, spaces, device: [FlattenObservations()],
        )
        .training(**training)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=hidden))
        .reporting(min_time_s_per_iteration=SECONDS_PER_ITERATION)
        .debugging(seed=seed)
    )


def sac_demo_config(params_file: str | Path, *, port: int, seed: int = 0, host: str = "127.0.0.1") -> Any:
    """The SAC config that trains the demo reachers while they keep acting (docs/rllib.md's SAC example)."""
    from plugrl_ros.rllib import RunnerSettings, chunk_gamma, robot_spaces

    # the policy reads the states; the bridge also sends the camera, which the runner ignores
    spaces = robot_spaces(params_file, horizon=HORIZON, images=[], state_dims={"target": 4})
    # no API key: the demo's bridge, started by the same command, sends none (as the PPO demo's runner)
    runner = RunnerSettings(
        host=host, port=port, horizon=HORIZON, sample_wait_s=10.0, serve_during_updates=True, api_key_env=""
    )
    training = {
        "gamma": chunk_gamma(GAMMA, HORIZON),
        "actor_lr": 1e-3,
        "critic_lr": 1e-3,
        "alpha_lr": 1e-3,
        "initial_alpha": 0.2,
        "tau": 0.02,
        "train_batch_size_per_learner": BATCH,
        "num_steps_sampled_before_learning_starts": WARM_UP_STEPS,
        "replay_buffer_config": {"type": "EpisodeReplayBuffer", "capacity": 100_000},
    }
    return local_sac(spaces, runner, training=training, hidden=[64, 64], seed=seed, sample_timeout_s=30.0)
