"""Stable-Baselines3 through ROS: the very same episodes as SB3 on the env itself, and what the ROS path costs.

Run: ``python bench/bench_sb3.py [--quick] [--case ppo|sac ...] [--seeds 3] [--json PATH]`` (needs the gym and
sb3 extras: ``scripts/setup-venv.sh .venv kilted "" gym,sb3``; ``OMP_NUM_THREADS=1`` on a small machine).

Two cases, as SB3's users run them: PPO on InvertedPendulum-v5 and SAC on
Pendulum-v1, with SB3's default settings (``MlpPolicy``; PPO's rollouts of
2048 steps, SAC's 100 random steps first), one copy, lockstep, H = 1. Each
seed trains two ways:

* direct: SB3 on ``gymnasium.make(ENV)`` in this process, each episode reset
  with the seed the gym robot uses for it (``episode_seed``; SB3 would reset
  every episode after the first unseeded);
* ros: ``plugrl-gym-robot --seed SEED`` and the bridge with its printed
  config, SB3 on :class:`~plugrl_ros.sb3.RobotVecEnv` (``observation="box"``).

The target is the very same run: SB3 is deterministic on the CPU given its
seed, and the gym robot carries every observation, reward and flag exactly,
so every episode's return and length as SB3 received them (float32 rewards,
summed here in float64 in the same order) must be equal to the last bit, and
so must the trained policy's weights. Where they differ the first differing
episode is named. The cost: wall-clock per env step (SB3's updates included,
so it is what a user waits) and CPU per env step of each process (this one,
which runs SB3; the robot; the bridge), the ros path over the direct one,
measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

CASES = {
    # name: (algorithm, env, env steps per run, SB3 settings beyond its defaults)
    "ppo": ("PPO", "InvertedPendulum-v5", 20_480, {}),
    "sac": ("SAC", "Pendulum-v1", 10_000, {}),
}
QUICK = {
    "ppo": (512, {"n_steps": 128, "batch_size": 64, "n_epochs": 2}),
    "sac": (400, {"learning_starts": 100}),
}


@dataclass
class Run:
    path: str
    seed: int
    episodes: list[tuple[float, int]]  # (return as SB3 received it, length), in the order they ended
    steps: int
    wall_s: float
    cpu_s: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds over the learning
    weights: dict[str, Any] = field(default_factory=dict)


def seeded(env_id: str, seed: int) -> Any:
    """``gymnasium.make(env_id)`` whose every episode is reset with the gym robot's seed for it (copy 0)."""
    import gymnasium as gym

    from plugrl_ros.gym.copies import episode_seed

    class EpisodeSeeds(gym.Wrapper):
        def __init__(self, env: gym.Env) -> None:
            super().__init__(env)
            self.episodes = 0

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
            episode = episode_seed(seed_of_run, 0, self.episodes)
            self.episodes += 1
            return self.env.reset(seed=episode, options=options)

    seed_of_run = seed
    return EpisodeSeeds(gym.make(env_id))


def episode_logger(episodes: list[tuple[float, int]]) -> Any:
    """An SB3 callback that sums each env's rewards as SB3 received them, in float64, and logs each episode."""
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    class Episodes(BaseCallback):
        def _on_training_start(self) -> None:
            self.returns = np.zeros(self.training_env.num_envs)
            self.lengths = np.zeros(self.training_env.num_envs, dtype=int)

        def _on_step(self) -> bool:
            self.returns += self.locals["rewards"].astype(np.float64)
            self.lengths += 1
            for i in np.flatnonzero(self.locals["dones"]):
                episodes.append((float(self.returns[i]), int(self.lengths[i])))
                self.returns[i], self.lengths[i] = 0.0, 0
            return True

    return Episodes()


def _cpu(process: Any) -> float:
    times = process.cpu_times()
    return times.user + times.system


def train(case: str, path: str, seed: int, steps: int, settings: dict[str, Any], tmp: Path) -> Run:
    import psutil
    import stable_baselines3
    import torch

    from plugrl_ros.protocol.server_auth import ServerAccess
    from plugrl_ros.sb3 import RobotVecEnv
    from plugrl_ros.vector import VectorSettings

    algorithm, env_id, _, _ = CASES[case]
    torch.set_num_threads(1)
    make = getattr(stable_baselines3, algorithm)
    episodes: list[tuple[float, int]] = []
    me = psutil.Process()
    if path == "direct":
        model = make("MlpPolicy", seeded(env_id, seed), seed=seed, device="cpu", **settings)
        cpu0, began = _cpu(me), time.monotonic()
        model.learn(steps, callback=episode_logger(episodes))
        wall, cpu = time.monotonic() - began, {"trainer": _cpu(me) - cpu0}
        return Run(path, seed, episodes, steps, wall, cpu, _weights(model))
    config = tmp / f"gym_{env_id}.yaml"
    if not config.exists():
        import bench_gym

        config = bench_gym.bridge_config(env_id, 1, tmp)
    from plugrl_ros.gym.copies import GymCopy

    copy = GymCopy(env_id, 0, seed)
    dims = {key.name: key.size for key in copy.keys}  # what the gym robot sends; the printed config leaves it open
    copy.close()
    settings_of_env = VectorSettings(port=0, access=ServerAccess(api_key_env=""))
    env = RobotVecEnv.from_params(config, 1, settings_of_env, observation="box", state_dims=dims)
    with common.children() as started:
        try:
            robot = common.python_module("plugrl_ros.gym.robot_node", "--env", env_id, "--seed", str(seed))
            started.append(common.Child(robot))
            bridge = common.bridge_command(
                None, "--ros-args", "--params-file", str(config), "-p", f"trainer.uri:=ws://127.0.0.1:{env.port}",
                "-p", "status.log_period_s:=0.0", "--log-level", "warn",
            )  # fmt: skip
            started.append(common.Child(bridge))
            model = make("MlpPolicy", env, seed=seed, device="cpu", **settings)
            processes = {
                "trainer": me,
                "robot": psutil.Process(started[0].pid),
                "bridge": psutil.Process(started[1].pid),
            }
            env.env.reset()  # the robot and the bridge are up: their start is not the learning's cost
            before = {name: _cpu(p) for name, p in processes.items()}
            began = time.monotonic()
            model.learn(steps, callback=episode_logger(episodes))
            wall = time.monotonic() - began
            cpu = {name: _cpu(p) - before[name] for name, p in processes.items()}
            for child in started:
                if not child.alive():
                    raise RuntimeError(f"a ros process exited:\n{child.output()[-3000:]}")
        finally:
            env.close()  # the run ends (plugrl-server-stop) before the robot and the bridge are stopped
    return Run(path, seed, episodes, steps, wall, cpu, _weights(model))


def _weights(model: Any) -> dict[str, Any]:
    return {name: tensor.detach().clone() for name, tensor in model.policy.state_dict().items()}


def same_weights(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def first_difference(a: list[tuple[float, int]], b: list[tuple[float, int]]) -> int | None:
    """The index of the first episode that differs (or where one list ends early); None if they are equal."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(case: str, seeds: int, quick: bool, tmp: Path) -> dict[str, Any]:
    algorithm, env_id, steps, settings = CASES[case]
    if quick:
        steps, extra = QUICK[case]
        settings = {**settings, **extra}
    rows = []
    for seed in range(seeds):
        direct = train(case, "direct", seed, steps, settings, tmp)
        ros = train(case, "ros", seed, steps, settings, tmp)
        difference = first_difference(direct.episodes, ros.episodes)
        rows.append(
            {
                "seed": seed,
                "episodes": [len(direct.episodes), len(ros.episodes)],
                "last_return": [
                    direct.episodes[-1][0] if direct.episodes else None,
                    ros.episodes[-1][0] if ros.episodes else None,
                ],
                "mean_return_last_10": [_mean_last(direct.episodes), _mean_last(ros.episodes)],
                "identical_episodes": difference is None,
                "first_difference": difference,
                "identical_weights": same_weights(direct.weights, ros.weights),
                "wall_per_step_ms": [1000 * direct.wall_s / steps, 1000 * ros.wall_s / steps],
                "cpu_per_step_ms": {
                    "direct": {name: 1000 * s / steps for name, s in direct.cpu_s.items()},
                    "ros": {name: 1000 * s / steps for name, s in ros.cpu_s.items()},
                },
            }
        )
    return {"case": case, "algorithm": algorithm, "env": env_id, "steps": steps, "settings": settings, "seeds": rows}


def _mean_last(episodes: list[tuple[float, int]], n: int = 10) -> float | None:
    tail = [ret for ret, _ in episodes[-n:]]
    return statistics.fmean(tail) if tail else None


def tables(results: list[dict[str, Any]]) -> str:
    out = []
    rows = []
    for result in results:
        for row in result["seeds"]:
            direct, ros = row["mean_return_last_10"]
            rows.append([
                f"SB3 {result['algorithm']} {result['env']}", row["seed"], f"{result['steps']:,}",
                f"{row['episodes'][0]} / {row['episodes'][1]}",
                f"{direct:.3f} / {ros:.3f}" if direct is not None and ros is not None else "-",
                "yes" if row["identical_episodes"] else f"no (episode {row['first_difference']})",
                "yes" if row["identical_weights"] else "no",
            ])  # fmt: skip
    out.append(
        common.md_table(
            [
                "case",
                "seed",
                "env steps",
                "episodes (direct / ros)",
                "mean return, last 10 (direct / ros)",
                "same episodes, to the last bit",
                "same trained weights",
            ],
            rows,
        )
    )
    cost = []
    for result in results:
        seeds = result["seeds"]
        wall = [r["wall_per_step_ms"] for r in seeds]
        direct_wall = statistics.fmean(w[0] for w in wall)
        ros_wall = statistics.fmean(w[1] for w in wall)
        cpu = {
            name: statistics.fmean(r["cpu_per_step_ms"]["ros"][name] for r in seeds)
            for name in ("trainer", "robot", "bridge")
        }
        direct_cpu = statistics.fmean(r["cpu_per_step_ms"]["direct"]["trainer"] for r in seeds)
        cost.append([
            f"SB3 {result['algorithm']} {result['env']}",
            f"{direct_wall:.2f}", f"{ros_wall:.2f}", common.fmt_ratio(ros_wall / direct_wall),
            f"{direct_cpu:.2f}", f"{cpu['trainer']:.2f}", f"{cpu['robot']:.2f}", f"{cpu['bridge']:.2f}",
            common.fmt_ratio(sum(cpu.values()) / direct_cpu),
        ])  # fmt: skip
    out.append(
        common.md_table(
            [
                "case",
                "wall ms/step direct",
                "wall ms/step ros",
                "ros / direct",
                "CPU ms/step direct",
                "CPU trainer (ros)",
                "CPU robot",
                "CPU bridge",
                "CPU ros / direct",
            ],
            cost,
        )
    )
    return "\n\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="ppo, sac (default: both)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a few hundred steps: a smoke run, not a measurement")
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args()
    common.use_own_domain()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-sb3-") as tmp:
        results = [compare(case, args.seeds, args.quick, Path(tmp)) for case in (args.case or sorted(CASES))]
    print(tables(results))
    common.save_json(args.json, "bench_sb3", {"results": results})
    identical = all(row["identical_episodes"] and row["identical_weights"] for r in results for row in r["seeds"])
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
