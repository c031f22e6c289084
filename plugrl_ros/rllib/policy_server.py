"""``plugrl-policy-server --rllib CHECKPOINT --config robot.yaml``: an RLlib policy served as openpi serves one.

The server, its contract and its command line are
:mod:`plugrl_ros.serve.policy_server`'s; this backend loads the checkpoint's
policy without exploration (:mod:`plugrl_ros.rllib.checkpoint_policy`) and
reads each request into its observation space by the bridge's own params file
(:mod:`plugrl_ros.serve.request_reader`), checked against the checkpoint at
startup. Torch and Ray run here only: the robot needs neither.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from plugrl_ros.serve.policy_server import EXIT_BAD_INPUT, SERVER_NAME, LoadedPolicy, load_and_serve, parse

log = logging.getLogger("plugrl_ros.rllib.policy_server")


def load(args: argparse.Namespace) -> LoadedPolicy:
    """The checkpoint ``args.rllib`` as a served policy (CheckpointError, ConfigMismatch or ConfigError if not)."""
    import ray

    from plugrl_ros.rllib.checkpoint_policy import load_checkpoint_policy
    from plugrl_ros.serve.request_reader import RequestReader

    policy = load_checkpoint_policy(args.rllib, args.module_id)
    reader = RequestReader.from_params_file(args.config, policy.observation_space, policy.action_space, args.horizon)
    return LoadedPolicy(
        act=lambda request: policy.act(reader.observation(request), reader.chunks),
        horizon=reader.chunks.horizon,
        action_dim=reader.chunks.action_dim,
        policy=f"RLlib {ray.__version__} {type(policy.module).__name__} (no exploration)",
        source=str(policy.parts.root),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGINT or SIGTERM, then exit 0; 2 for a checkpoint or params file it cannot serve."""
    args = parse(list(argv) if argv is not None else None)
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    if args.rllib is None:
        print(f"{SERVER_NAME}: this backend serves --rllib CHECKPOINT", file=sys.stderr)
        return EXIT_BAD_INPUT
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in ("ray", "ray.rllib"):
        logging.getLogger(name).setLevel(logging.ERROR)  # RLlib's notices on loading are not the operator's
    from plugrl_ros.params.section import ConfigError
    from plugrl_ros.rllib.checkpoint_policy import CheckpointError
    from plugrl_ros.serve.request_reader import ConfigMismatch

    return load_and_serve(args, load, (CheckpointError, ConfigMismatch, ConfigError))


if __name__ == "__main__":
    sys.exit(main())
