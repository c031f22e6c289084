"""An RLlib driver as a process of its own, for the restart test: PPO through a runner, a checkpoint per iteration.

    python rllib_restart_driver.py PORT FOLDER   (the demo robots' spaces from config/demo.yaml, H = 1)

Builds the demo's PPO (smaller batches), prints the fresh weights' digest, resumes
from the latest checkpoint in FOLDER if there is one (printing what it restored),
then trains, saving a checkpoint after every iteration (CheckpointedTraining), and
prints one JSON line per iteration: the iteration, RLlib's lifetime step count, the
mean return of the robot episodes that ended in it (the bridge's count), the
checkpoint written and digests of the learner's weights, the runner's weights and
the runner's connector state (the MeanStdFilter's statistics) as saved. SIGINT ends
the run (the bridges get plugrl-server-stop); SIGKILL is a crash.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from plugrl_ros.rllib.checkpoints import CheckpointedTraining
from plugrl_ros.rllib.demo import demo_config

CONFIG = Path(__file__).resolve().parent.parent / "config" / "demo.yaml"


def digest(state: Any) -> str:
    """A digest of a nested state (dicts, arrays, numbers): equal states, equal digests."""
    h = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, dict):
            for key in sorted(value, key=str):
                h.update(str(key).encode())
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                feed(item)
        elif hasattr(value, "detach"):  # a torch tensor
            feed(value.detach().cpu().numpy())
        elif isinstance(value, (np.ndarray, np.generic)):
            h.update(np.ascontiguousarray(value).tobytes())
        else:
            h.update(repr(value).encode())

    feed(state)
    return h.hexdigest()[:16]


def digests(algo: Any) -> dict[str, str]:
    from ray.rllib.core import COMPONENT_ENV_TO_MODULE_CONNECTOR, COMPONENT_RL_MODULE

    runner = algo.env_runner.get_state()
    return {
        "learner": digest(algo.get_module().get_state()),
        "runner": digest(runner[COMPONENT_RL_MODULE]),
        "filter": digest(runner[COMPONENT_ENV_TO_MODULE_CONNECTOR]),
    }


def main() -> int:
    import ray
    import torch

    stop = []
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    torch.set_num_threads(1)
    port, folder = int(sys.argv[1]), Path(sys.argv[2])
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    config = demo_config(CONFIG, port=port)
    config.env_config["plugrl"]["sample_wait_s"] = 5.0
    config = config.training(train_batch_size_per_learner=400, minibatch_size=100, num_epochs=5)
    algo = config.build_algo()
    print(json.dumps({"event": "built", **digests(algo)}), flush=True)
    training = CheckpointedTraining(algo, folder, every=1, keep=2)
    restored = training.resume()
    if restored is not None:
        print(
            json.dumps(
                {
                    "event": "restored",
                    "checkpoint": str(restored),
                    "iteration": algo.training_iteration,
                    **digests(algo),
                }
            ),
            flush=True,
        )
    runner = algo.env_runner
    seen = len(runner.episode_log)
    while not stop:
        result = training.train()
        episodes = list(runner.episode_log)[seen:]
        seen += len(episodes)
        line = {
            "event": "iteration",
            "iteration": algo.training_iteration,
            "lifetime_steps": result["env_runners"].get("num_env_steps_sampled_lifetime"),
            "episodes": len(episodes),
            "return": float(np.mean([e.ret for e in episodes])) if episodes else None,
            "checkpoint": str(folder / f"checkpoint_{algo.training_iteration:06d}"),
            **digests(algo),
        }
        print(json.dumps(line), flush=True)
    algo.stop()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
