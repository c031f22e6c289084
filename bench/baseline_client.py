"""The throughput baseline: the probe envs stepped in-process by a plain Python client loop.

Run: ``python bench/baseline_client.py --server ws://HOST:PORT --envs N``.

What a minimal hand-written PlugRL client does, with no ROS, no scheduler,
no validation and no thread hand-offs: websockets' synchronous client,
msgpack with openpi's ndarray hooks, every env in every infer, and the
whole chunk stepped at once. Its speed is what the bridge's lockstep
throughput is compared with. It runs until interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_codec import baseline_packb, baseline_unpackb
from websockets.sync.client import connect

from plugrl_ros.tools.probe_env import ProbeEnvs


def observation(envs: ProbeEnvs) -> dict:
    return {
        "images": {},
        "states": {"t": envs.t.astype("<f8").reshape(envs.n, 1), "a": envs.a.copy()},
        "text": np.array([""] * envs.n),
    }


def run(uri: str, n: int) -> None:
    with connect(uri, compression=None, max_size=None, ping_interval=None) as ws:
        metadata = baseline_unpackb(ws.recv())["data"]
        envs = ProbeEnvs(n, int(metadata["action_dim"]))
        ids = np.arange(n, dtype="<i8")
        step_ids = np.zeros(n, dtype="<i8")
        while True:
            ws.send(
                baseline_packb(
                    {"message_type": "infer", "data": observation(envs), "env_indices": ids, "step_ids": step_ids}
                )
            )
            action = baseline_unpackb(ws.recv())["data"]["action"]
            rewards = np.zeros(n, dtype="<f4")
            terminated = np.zeros(n, dtype=bool)
            for env in range(n):
                for k in range(action.shape[0]):
                    reward, done = envs.step(env, action[k, env])
                    rewards[env] += reward
                    if done:
                        terminated[env] = True
                        break
            ws.send(
                baseline_packb(
                    {
                        "message_type": "feedback",
                        "env_indices": ids,
                        "step_ids": step_ids,
                        "data": {
                            "obs": observation(envs),
                            "rewards": rewards,
                            "terminated": terminated,
                            "truncated": np.zeros(n, dtype=bool),
                            "info": {},
                        },
                    }
                )
            )
            step_ids += 1
            for env in np.flatnonzero(terminated):
                envs.reset(int(env))
                step_ids[env] = 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--envs", type=int, default=1)
    args = parser.parse_args()
    try:
        run(args.server, args.envs)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
