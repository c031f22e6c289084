"""The fleet harness's driver on the head: RLlib PPO, one PlugRL runner per site, checkpoints, a JSON line an iteration.

    python driver.py --address HEAD:6379 --sites 2 --checkpoint DIR [--restore] [--iterations N]

Connects to the running Ray cluster (token authentication from the
environment), builds the demo's PPO (``plugrl_ros.rllib.demo``) with
``num_env_runners`` = the number of sites, each runner placed on a site node by
the ``plugrl_site`` resource and listening on that site's fixed address
(``RunnerSettings.site_label``), and trains. ``--restore`` builds the
algorithm from the checkpoint in DIR instead (``Algorithm.from_checkpoint``).
After each iteration it prints one JSON line; it saves a checkpoint every
``--checkpoint-every`` iterations. On stdin, ``hold`` makes it stop between
iterations (the robots wait for their next action) and print ``{"held": ...}``
until ``go``; ``stop`` ends the run (every bridge gets plugrl-server-stop).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "config" / "demo.yaml"


def build(args: argparse.Namespace):
    from ray.rllib.algorithms.algorithm import Algorithm

    from plugrl_ros.rllib.demo import demo_config

    if args.restore:
        return Algorithm.from_checkpoint(str(args.checkpoint))
    config = demo_config(DEMO, port=args.port, host="0.0.0.0")
    config.env_config["plugrl"].update(site_label=args.site_label, sample_wait_s=5.0)
    return (
        config.env_runners(
            num_env_runners=args.sites,
            num_cpus_per_env_runner=1,
            custom_resources_per_env_runner={args.site_resource: 1},
            # a site cut off the head stalls the iteration up to this long; a sample later than this is
            # dropped by RLlib, with its steps (docs/rllib.md)
            sample_timeout_s=90.0,
        )
        .training(train_batch_size_per_learner=args.batch, minibatch_size=args.batch // 2, num_epochs=4)
        .fault_tolerance(restart_failed_env_runners=True)
        .build_algo()
    )


def log_runners() -> None:
    """In each Ray worker: the runners' own log lines (listening, failures) go to the node's worker log."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("plugrl_ros")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def runners(algo) -> list:
    """(worker_index, site, port, bridges connected) of every healthy remote runner."""
    found = algo.env_runner_group.foreach_env_runner(
        lambda r: (r.worker_index, r.site, r.port, r.figures.bridges), local_env_runner=False, timeout_seconds=10.0
    )
    return sorted(found)


class Orders:
    """The harness's orders, one a line on stdin (read from the descriptor: a buffered reader would hide lines)."""

    def __init__(self) -> None:
        self._buffer = b""

    def next(self, timeout: float) -> str | None:
        """The next line if one comes within ``timeout`` s; ``stop`` when the harness closed stdin."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([0], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(0, 4096)
            if not chunk:
                return "stop"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode().strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--sites", type=int, default=2)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--site-label", default="plugrl-site")
    parser.add_argument("--site-resource", default="plugrl_site")
    parser.add_argument("--batch", type=int, default=400)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--restore", action="store_true")
    parser.add_argument("--iterations", type=int, default=1000, help="a bound: the harness stops it long before")
    args = parser.parse_args()

    import ray
    import torch

    torch.set_num_threads(1)
    started = time.monotonic()
    ray.init(
        address=args.address,
        log_to_driver=False,
        logging_level=logging.ERROR,
        runtime_env={"worker_process_setup_hook": log_runners},
    )
    algo = build(args)
    module = algo.get_module()
    weights = sum(p.numel() * p.element_size() for p in module.parameters()) if module is not None else 0
    built = {"built": time.monotonic() - started, "restored": args.restore, "runners": runners(algo)}
    print(json.dumps({**built, "weights_bytes": weights}))
    sys.stdout.flush()
    lifetime = 0
    orders = Orders()
    try:
        for _ in range(args.iterations):
            order = orders.next(0.0)
            if order == "hold":
                print(json.dumps({"held": lifetime}))
                sys.stdout.flush()
                order = orders.next(120.0)
            if order == "stop":
                break
            result = algo.train()
            runners_ = result.get("env_runners", {})
            lifetime = runners_.get("num_env_steps_sampled_lifetime", 0)
            timers = result.get("timers", {})
            line = {
                "iteration": result["training_iteration"],
                "t": time.time(),
                "steps": runners_.get("num_env_steps_sampled", 0),
                "lifetime": lifetime,
                "return": runners_.get("episode_return_mean"),
                "healthy": algo.env_runner_group.num_healthy_remote_workers(),
                "restarts": algo.env_runner_group.num_remote_worker_restarts(),
                "sample_s": timers.get("env_runner_sampling_timer"),
                "learn_s": timers.get("learner_update_timer"),
                "sync_s": timers.get("synch_weights"),
                "runners": runners(algo),
            }
            if result["training_iteration"] % args.checkpoint_every == 0:
                saved = time.monotonic()
                algo.save_to_path(str(args.checkpoint))
                line["checkpoint_s"] = time.monotonic() - saved
                line["checkpoint"] = result["training_iteration"]
            print(json.dumps(line, default=str))
            sys.stdout.flush()
    finally:
        algo.stop()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
