"""The direct path: copies of a Gymnasium env stepped in-process by the package's headless client, no ROS.

The same rollout core and websocket client as the bridge (the headless
probe's, :class:`~plugrl_ros.tools.headless_probe.HeadlessProbe`), stepping
:class:`~plugrl_ros.gym.copies.GymCopies` with the episode seeds, the action
clipping and the time limit that ``plugrl-gym-robot`` and its generated
bridge config apply. It is the reference the ROS path is held against: a
trainer must learn the same from both (bench/bench_gym.py).

Run: ``python -m plugrl_ros.gym.direct --env ID --server ws://HOST:PORT [--copies N] [--seed S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from plugrl_ros import stop_request
from plugrl_ros.gym.copies import Camera, GymCopies, make_env
from plugrl_ros.gym.spaces import action_layout
from plugrl_ros.protocol.client import ClientSettings
from plugrl_ros.tools.headless_probe import HeadlessProbe, HeadlessSettings


def direct_settings(env_id: str, copies: int, client: ClientSettings, steps: int | None = None) -> HeadlessSettings:
    """The headless client's settings for ``copies`` copies of ``env_id``, as the generated bridge config sets
    the bridge: the action's width and the env's own time limit."""
    env = make_env(env_id)
    try:
        max_steps = env.spec.max_episode_steps if env.spec is not None else None
        width = action_layout(env.action_space).width
    finally:
        env.close()
    return HeadlessSettings(
        client=client, n_envs=copies, steps=steps, action_dim=width, max_episode_steps=int(max_steps or 0)
    )


def run_direct(env_id: str, settings: HeadlessSettings, seed: int, camera: Camera | None = None) -> int:
    """Step the copies against the trainer until the run ends (or Ctrl-C/SIGTERM); the exit status."""
    copies: list[GymCopies] = []

    def make(n: int, width: int) -> GymCopies:
        made = GymCopies(env_id, n, seed, camera)
        copies.append(made)
        if made.action_dim != width:
            raise ValueError(f"{env_id} takes {made.action_dim} action value(s), the trainer sends {width}")
        return made

    async def run() -> int:
        client = HeadlessProbe(settings, make)
        with stop_request.calling_in_loop(asyncio.get_running_loop(), client.client.stop):
            return await client.run()

    stop_request.install()
    try:
        return asyncio.run(run())
    finally:
        for made in copies:
            made.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plugrl_ros.gym.direct", description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="a Gymnasium env id")
    parser.add_argument("--server", default="ws://localhost:8000", help="trainer URI (default %(default)s)")
    parser.add_argument("--copies", type=int, default=1, help="copies of the env (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every episode's reset (default %(default)s)")
    parser.add_argument("--camera", type=Camera.parse, default=None, metavar="WxH", help="send rendered pictures")
    parser.add_argument("--quiet", action="store_true", help="only warnings and errors")
    args = parser.parse_args(argv)
    if args.copies < 1:
        parser.error("--copies must be at least 1")
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO, format="[gym-direct] %(message)s", stream=sys.stderr
    )
    settings = direct_settings(args.env, args.copies, ClientSettings(uri=args.server))
    return run_direct(args.env, settings, args.seed, args.camera)


if __name__ == "__main__":
    sys.exit(main())
