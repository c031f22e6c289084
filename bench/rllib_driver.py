"""One RLlib training run in a process of its own, for the RLlib benchmarks: RLlib's own runner, or a PlugRL runner.

Run: ``python bench/rllib_driver.py --algorithm ppo|sac --runner own|plugrl --env ID --params-file FILE
--out RESULT.json [--copies N] [--seed S] [--steps N] [--serve-during-updates]``.

Both runners train the same algorithm with the same config, seed and RLModule;
the PlugRL runner on spaces read from the bridge config (:func:`robot_spaces`,
flattened by ``FlattenObservations``; PPO's ``MeanStdFilter`` on both paths):

* ``own``: RLlib's :class:`SingleAgentEnvRunner` steps the env in this
  process, as an RLlib user would run it (``num_envs_per_env_runner`` copies,
  a vector env). For PPO's cost the env is :class:`RobotShapedEnv`: the
  Gymnasium env with the observation and action spaces the bridge config gives
  the runner, and the episode seeds, action clipping and time limit of
  ``plugrl-gym-robot`` and its bridge (:class:`~plugrl_ros.gym.copies.GymCopy`),
  so that both paths step the same env code. For SAC it is RLlib's tuned
  example itself: the env by its id, RLlib's own seeding and spaces, no
  connector: the curve the bridge is compared with is RLlib's published one,
  not one through this package's code. (The two envs train alike: with
  RLlib's seed and the same episode starts, RobotShapedEnv's returns follow
  the plain env's as closely as two runs of the plain env follow each other.)
* ``plugrl``: :class:`~plugrl_ros.rllib.env_runner.PlugRLEnvRunner` listens
  on a free port (printed as ``PORT n``) for the bridge of ``plugrl-gym-robot``
  copies, which the benchmark starts.

Both runners are subclassed only to time ``sample()`` (wall-clock and this
process's CPU, every thread's). After every training iteration the driver
records the time, this process's CPU, the env steps sampled and the episodes
that ended; at the end it writes them to ``--out`` (JSON). The benchmark reads
the other processes' CPU itself and lines them up by the monotonic clock.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import bench_gym  # noqa: E402
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from plugrl_ros.gym.copies import GymCopy  # noqa: E402

ALGORITHMS = ("ppo", "sac")
RUNNERS = ("own", "plugrl")
HORIZON = 1  # one decision per control step, on both paths (plugrl: --horizon H, one decision per H steps)

# RLlib PPO for InvertedPendulum-v5: bench_gym.py's settings (tuned on this machine with RLlib's own runner)
PPO_SETTINGS, PPO_HIDDEN = bench_gym.PPO_SETTINGS, bench_gym.PPO_HIDDEN
# RLlib's tuned Pendulum SAC (ray/rllib/tuned_examples/sac/pendulum_sac.py, Ray 2.60, one learner)
SAC_SETTINGS: dict[str, Any] = {
    "initial_alpha": 1.001,
    "actor_lr": 2e-4,
    "critic_lr": 8e-4,
    "alpha_lr": 9e-4,
    "lr": None,
    "target_entropy": "auto",
    "n_step": (2, 5),
    "tau": 0.005,
    "train_batch_size_per_learner": 256,
    "target_network_update_freq": 1,
    "replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 100000, "alpha": 1.0, "beta": 0.0},
    "num_steps_sampled_before_learning_starts": 256,
}
# A sample() waits for its whole batch (far above the time a batch takes): a sample cut short makes the run
# depend on how fast the path steps.
SAMPLE_WAIT_S = 300.0


class RobotShapedEnv(gym.Env):
    """A Gymnasium env as the PlugRL runner sees it through ``plugrl-gym-robot`` and its bridge: the runner's
    spaces (:func:`robot_spaces` of the bridge config), the robot's episode seeds, clipping and time limit."""

    def __init__(self, env_id: str, index: int, seed: int, spaces: Any) -> None:
        self.copy = GymCopy(env_id, index, seed)
        self.observation_space = spaces.observation_space
        self.action_space = spaces.action_space

    def _observation(self) -> dict[str, dict[str, np.ndarray]]:
        return {"states": {name: values.astype(np.float32) for name, values in self.copy.states().items()}}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        del seed, options  # episode k of copy i always starts from the robot's seed for it
        self.copy.reset()
        return self._observation(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        values = self.copy.action.clip(np.asarray(action, dtype=np.float64).reshape(-1))  # as the bridge clips
        result = self.copy.step(values)
        return self._observation(), result.reward, result.terminated, result.truncated, {}

    def close(self) -> None:
        self.copy.close()


def timed(base: type) -> type:
    """``base`` with ``sample()`` timed (wall-clock and this process's CPU, all threads, summed), and the
    episodes it returned added up chunk by chunk: (ended at, return, length) of each that ended."""

    class Timed(base):  # type: ignore[misc, valid-type]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.sample_wall = 0.0
            self.sample_cpu = 0.0
            self.ended: list[tuple[float, float, int]] = []
            self._running: dict[str, tuple[float, int]] = {}  # episode id -> return and length so far

        def sample(self, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                samples = super().sample(**kwargs)
            finally:
                self.sample_wall += time.perf_counter() - wall
                self.sample_cpu += time.process_time() - cpu
            now = time.monotonic()
            for episode in samples:
                ret, length = self._running.pop(episode.id_, (0.0, 0))
                ret, length = ret + float(episode.get_return()), length + len(episode)
                if episode.is_done:
                    self.ended.append((now, ret, length))
                else:
                    self._running[episode.id_] = (ret, length)
            return samples

    Timed.__name__ = f"Timed{base.__name__}"
    return Timed


def build_config(args: argparse.Namespace, spaces: Any) -> Any:
    from ray.rllib.connectors.env_to_module import FlattenObservations, MeanStdFilter
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from plugrl_ros.rllib import PlugRLEnvRunner, RunnerSettings

    if args.algorithm == "ppo":
        from ray.rllib.algorithms.ppo import PPOConfig

        config = PPOConfig().training(**PPO_SETTINGS)
        config = config.rl_module(model_config=DefaultModelConfig(fcnet_hiddens=PPO_HIDDEN))
        connectors = lambda env, spaces, device: [FlattenObservations(), MeanStdFilter()]  # noqa: E731
    else:
        from ray.rllib.algorithms.sac import SACConfig
        from torch import nn

        config = (
            SACConfig()
            .training(**SAC_SETTINGS)
            .rl_module(
                model_config=DefaultModelConfig(
                    fcnet_hiddens=[256, 256],
                    fcnet_activation="relu",
                    fcnet_kernel_initializer=nn.init.xavier_uniform_,
                    head_fcnet_hiddens=[],
                    head_fcnet_activation=None,
                    head_fcnet_kernel_initializer="orthogonal_",
                    head_fcnet_kernel_initializer_kwargs={"gain": 0.01},
                )
            )
            .reporting(metrics_num_episodes_for_smoothing=5)
        )
        connectors = lambda env, spaces, device: [FlattenObservations()]  # noqa: E731
    if args.runner == "plugrl" or args.algorithm == "ppo":
        config = config.env_runners(env_to_module_connector=connectors)
    runner_cls: type
    if args.runner == "own" and args.algorithm == "sac":
        # RLlib's tuned example as its users run it: Box observations, so no connector
        config = config.environment(args.env)
        runner_cls = timed(SingleAgentEnvRunner)
    elif args.runner == "own":
        env_id, seed = args.env, args.seed
        made: list[RobotShapedEnv] = []

        class Copy(RobotShapedEnv):
            def __init__(self, env_config: Any) -> None:
                # the vector env's copies are made one after another: copy i gets the robot's copy i's seeds
                super().__init__(env_id, len(made), seed, spaces)
                made.append(self)

        # the class itself, not a name in Ray's registry (which would copy it, and the count of copies made)
        config = config.environment(Copy)
        runner_cls = timed(SingleAgentEnvRunner)
    else:
        runner = RunnerSettings(
            host="127.0.0.1", port=0, horizon=args.horizon, sample_wait_s=SAMPLE_WAIT_S,
            serve_during_updates=args.serve_during_updates,
        )  # fmt: skip
        config = config.environment(
            observation_space=spaces.observation_space, action_space=spaces.action_space, env_config=runner.env_config()
        )
        runner_cls = timed(PlugRLEnvRunner)
    return (
        config.env_runners(
            env_runner_cls=runner_cls,
            num_env_runners=0,
            num_envs_per_env_runner=args.copies,
            sample_timeout_s=2 * SAMPLE_WAIT_S,
        )
        .learners(num_learners=args.learners)
        .debugging(seed=args.seed)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=ALGORITHMS, required=True)
    parser.add_argument("--runner", choices=RUNNERS, required=True)
    parser.add_argument("--env", required=True, help="the Gymnasium env id")
    parser.add_argument("--params-file", required=True, help="the bridge config plugrl-gym-robot printed")
    parser.add_argument("--state-dims", default="", help="NAME=WIDTH,... the widths the printed config lacks")
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, required=True, help="env steps (RLlib's count) before the run ends")
    parser.add_argument("--seconds", type=float, default=0.0, help="or this long after the first iteration")
    parser.add_argument("--serve-during-updates", action="store_true", help="plugrl: answer through updates")
    parser.add_argument("--learners", type=int, default=0, help="learner processes (0: in this process)")
    parser.add_argument("--horizon", type=int, default=HORIZON, help="plugrl: control steps per chunk (RL step)")
    parser.add_argument("--out", required=True, help="the results file (JSON)")
    args = parser.parse_args()

    import ray
    import torch

    from plugrl_ros.rllib import robot_spaces

    torch.set_num_threads(1)
    dims = {k: int(v) for k, v in (item.split("=") for item in args.state_dims.split(",") if item)}
    if args.runner == "own" and args.horizon != HORIZON:
        parser.error("--horizon is the PlugRL runner's: RLlib's own runner steps the env once per decision")
    spaces = robot_spaces(args.params_file, horizon=args.horizon, state_dims=dims)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        algo = build_config(args, spaces).build_algo()
        runner = algo.env_runner
        if args.runner == "plugrl":
            print(f"PORT {runner.port}", flush=True)
        iterations: list[dict[str, float]] = []
        started = time.monotonic()
        reported = started
        idle: list[float] = []
        while True:
            result = algo.train()
            now = time.monotonic()
            steps = int(result["env_runners"].get("num_env_steps_sampled_lifetime", 0))
            iterations.append(
                {"t": now, "cpu": time.process_time(), "steps": steps, "sample_wall": runner.sample_wall,
                 "sample_cpu": runner.sample_cpu}
            )  # fmt: skip
            share = result["env_runners"].get("plugrl", {}).get("robot_idle_share")
            if share is not None:
                idle.append(float(share))
            if now - reported > 2.0:
                print(f"PROGRESS {steps} steps", flush=True)
                reported = now
            if steps >= args.steps or (args.seconds and now - iterations[0]["t"] >= args.seconds):
                break
        episodes = runner.ended
        Path(args.out).write_text(
            json.dumps({"iterations": iterations, "episodes": episodes, "robot_idle_share": idle}, default=float)
        )
        print("DONE", flush=True)
        algo.stop()
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
