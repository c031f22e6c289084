"""RLlib's behaviour cloning on exported demonstrations, saved as a checkpoint ``plugrl-policy-server --rllib`` serves.

Run (in a venv with the rllib extra): ``python bench/imitation_bc.py --offline DIR --checkpoint DIR
[--iterations 60] [--seed 0]``. ``--offline`` is what ``plugrl-export --to rllib --images ''`` wrote of the
demo reachers' teleop recording; BC is configured as ``test/test_rllib_offline.py`` trains it (batches of
64, learning rate 3e-3, the observations flattened by RLlib's ``FlattenObservations``). An offline
algorithm has no env runner, so its checkpoint holds no connector pipelines: the ones an env runner of
this config would build (``FlattenObservations``, then RLlib's defaults, which unsquash the normalised
actions) are built and saved beside the module with RLlib's own ``build_*_connector`` and
``save_to_path``, where the policy server reads them.
bench_imitation.py runs it with the rllib venv's python (LeRobot and Ray pin different torch versions).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def bc_config(params_file: Path, offline: Path, seed: int) -> Any:
    """RLlib's BC on the demonstrations ``plugrl-export --to rllib`` wrote into ``offline``, for the robot of
    ``params_file`` (its states; no images), with the connectors an env runner of it would build."""
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.connectors.env_to_module import FlattenObservations

    from plugrl_ros.serve.spaces import robot_spaces

    spaces = robot_spaces(params_file, images=[], state_dims={"target": 4})
    return (
        BCConfig()
        .environment(observation_space=spaces.observation_space, action_space=spaces.action_space)
        .env_runners(env_to_module_connector=lambda env, spaces, device: [FlattenObservations()])
        .offline_data(
            input_=[str(offline.resolve())],
            input_read_episodes=True,
            dataset_num_iters_per_learner=1,
            # one reading task: Ray Data's map over two CPUs would leave none to list the files
            map_batches_kwargs={"concurrency": 1, "num_cpus": 1},
        )
        .training(
            train_batch_size_per_learner=64,
            lr=3e-3,
            learner_connector=lambda obs_space, act_space: FlattenObservations(as_learner_connector=True),
        )
        .learners(num_learners=0)
        .debugging(seed=seed)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offline", type=Path, required=True, help="plugrl-export --to rllib's folder")
    parser.add_argument("--checkpoint", type=Path, required=True, help="where to save the algorithm")
    parser.add_argument("--config", type=Path, default=ROOT / "config" / "demo.yaml")
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import ray

    config = bc_config(args.config, args.offline, args.seed)
    started = time.monotonic()
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        algo = config.build_algo()
        for _ in range(args.iterations):
            algo.train()
        saved = Path(algo.save_to_path(str(args.checkpoint.resolve())))
        algo.stop()
        # an offline algorithm builds no env runner, so its checkpoint holds no connector pipelines; save
        # those a runner of this config builds, where an online algorithm without a local runner keeps them
        for name, pipeline in (
            ("env_to_module_connector", config.build_env_to_module_connector()),
            ("module_to_env_connector", config.build_module_to_env_connector()),
        ):
            # the state given (as a runner gives its own): pieces without state (FlattenObservations) are skipped
            pipeline.save_to_path(str(saved / name), state=pipeline.get_state())
    finally:
        ray.shutdown()
    print(json.dumps({"checkpoint": str(saved), "iterations": args.iterations, "seconds": time.monotonic() - started}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
