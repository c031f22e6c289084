"""A policy that acts at random, served as ``plugrl-policy-server`` serves a trained one (bench_imitation's baseline).

Run: ``python bench/random_policy_server.py [--port 0] [--horizon 10] [--action-dim 2] [--low -2] [--high 2]
[--seed 0]``. Every answer is a chunk ``[H, action_dim]`` drawn uniformly from ``[low, high]`` (the demo
reachers' speed limits by default), whatever the observation; the server is the package's own
(:class:`~plugrl_ros.serve.policy_server.PolicyServer`), so the bridge in ``mode: deploy`` sees the same
metadata, answers and access gate as from any served checkpoint.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from plugrl_ros.serve.policy_server import LoadedPolicy, run
from plugrl_ros.tools.serving import access_from, add_access_options


def random_policy(horizon: int, action_dim: int, low: float, high: float, seed: int) -> LoadedPolicy:
    rng = np.random.default_rng(seed)

    def act(_request: object) -> np.ndarray:
        return rng.uniform(low, high, size=(horizon, action_dim)).astype(np.float32)

    return LoadedPolicy(act, horizon, action_dim, "random (uniform)", f"uniform [{low:g}, {high:g}]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--horizon", type=int, default=10, help="H, steps per chunk")
    parser.add_argument("--action-dim", type=int, default=2)
    parser.add_argument("--low", type=float, default=-2.0)
    parser.add_argument("--high", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    add_access_options(parser)
    args = parser.parse_args(argv)
    loaded = random_policy(args.horizon, args.action_dim, args.low, args.high, args.seed)
    return run(loaded, access_from(args), args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())
