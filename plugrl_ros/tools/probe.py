"""``plugrl-probe``: check a trainer link (headless) or a whole ROS deployment with probe envs."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from plugrl_ros.protocol.client import ClientSettings
from plugrl_ros.tools.headless_probe import HeadlessSettings, run_headless


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plugrl-probe",
        description=(
            "Run probe envs (the protocol's conformance environment) against a PlugRL trainer. "
            "--headless runs them in-process with no ROS; without it, a probe robot node and a bridge "
            "node configured by config/probe.yaml run as real ROS processes."
        ),
    )
    parser.add_argument("--server", default="ws://localhost:8000", help="trainer URI (default %(default)s)")
    parser.add_argument("--envs", type=int, default=1, help="number of probe envs (default %(default)s)")
    parser.add_argument("--steps", type=int, default=None, help="stop by ourselves after this many feedbacks")
    parser.add_argument("--headless", action="store_true", help="no ROS: step the probe envs in-process")
    parser.add_argument("--mode", choices=("lockstep", "timer"), default="lockstep", help="ROS stepping mode")
    parser.add_argument("--rate", type=float, default=50.0, help="control rate in timer mode, Hz")
    parser.add_argument("--action-dim", type=int, default=None, help="action width if the trainer does not say")
    parser.add_argument("--replan-steps", type=int, default=0, help="run at most this many steps of each chunk")
    parser.add_argument("--max-episode-steps", type=int, default=0, help="truncate episodes after this many steps")
    parser.add_argument("--no-reuse", action="store_true", help="never use the reuse-feedback-obs feature")
    parser.add_argument("--text-as-list", action="store_true", help="send text as a msgpack list of str")
    parser.add_argument("--wait-for-next-run", action="store_true", help="after a stop, wait for the next run")
    parser.add_argument("--api-key-env", default="", help="name of the environment variable holding the API key")
    parser.add_argument("--ca-file", default="", help="CA bundle to verify a wss:// trainer")
    parser.add_argument(
        "--first-answer-timeout", type=float, default=300.0, help="dead link: seconds for a first answer (0 = none)"
    )
    parser.add_argument(
        "--answer-timeout", type=float, default=30.0, help="dead link: seconds for an answer (0 = none)"
    )
    parser.add_argument(
        "--tcp-timeout", type=float, default=20.0, help="TCP keepalive/user timeout, s (0 = OS default)"
    )
    parser.add_argument("--quiet", action="store_true", help="only warnings and errors")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="[plugrl-probe] %(message)s",
        stream=sys.stderr,
    )
    if args.envs < 1:
        print("plugrl-probe: --envs must be at least 1", file=sys.stderr)
        return 2
    client = ClientSettings(
        uri=args.server,
        api_key_env=args.api_key_env,
        ca_file=args.ca_file,
        wait_for_next_run=args.wait_for_next_run,
        first_answer_timeout_s=args.first_answer_timeout,
        answer_timeout_s=args.answer_timeout,
        tcp_timeout_s=args.tcp_timeout,
    )
    problem = client.access_problem(os.environ)
    if problem is not None:
        setting, value, why = problem
        shown = f" {value}" if setting == "ca_file" else ""  # the API-key variable is named in ``why``
        print(f"plugrl-probe: --{setting.replace('_', '-')}{shown}: {why}", file=sys.stderr)
        return 2
    if args.headless:
        return run_headless(
            HeadlessSettings(
                client=client,
                n_envs=args.envs,
                steps=args.steps,
                action_dim=args.action_dim,
                replan_steps=args.replan_steps,
                max_episode_steps=args.max_episode_steps,
                use_reuse=not args.no_reuse,
                text_format="list" if args.text_as_list else "array",
            )
        )
    from plugrl_ros.tools.probe_deployment import run_deployment

    return run_deployment(args, client)


if __name__ == "__main__":
    sys.exit(main())
