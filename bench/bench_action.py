"""Action path: the bytes of an action frame in, actuator messages published, against plain decode + publish.

Run: ``python bench/bench_action.py [--quick] [--repeat R] [--json PATH]``.

What the bridge does when the trainer's action arrives, through the code it
runs: the rollout core decodes and validates the frame and starts each env's
chunk (:meth:`Rollout.on_frame`), then each env's first step is taken and
published on its actuator (:meth:`EnvIO.publish`: limits, message building,
rclpy publish, with a subscriber matched so DDS really delivers). "first" is
the time until the first env's actuator message is published, "all" until
every env's is; "tick" is a later step of the chunk (what a timer tick costs
per step).

The baseline, measured in the same loop, is the least any client must do:
``msgpack.unpackb`` of the frame (no validation) plus one ``publish`` of a
prebuilt message per env.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import numpy as np
from bench_observation import JOINTS, bridge_params

ENV_COUNTS = (1, 4, 16)
HORIZON = 8


class ActionPath:
    def __init__(self, node: Any, n: int) -> None:
        from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
        from sensor_msgs.msg import JointState

        from plugrl_ros.protocol.codec import packb
        from plugrl_ros.protocol.messages import ObservationRow
        from plugrl_ros.robot.env_io import EnvIO, ShapeGuard
        from plugrl_ros.rollout.rollout import RolloutSettings
        from plugrl_ros.ros.config import load_config
        from plugrl_ros.ros.qos import qos_profile

        self.n = n
        self.node = node
        config = load_config(bridge_params("none", n))
        group = MutuallyExclusiveCallbackGroup()
        self.ios = [
            EnvIO(node, i, ns, config, ShapeGuard(), group, lambda env: None, time.monotonic)
            for i, ns in enumerate(config.envs)
        ]
        self.settings = RolloutSettings(n_envs=n, min_action_width=config.action_width_needed)
        self._listeners = [
            node.create_subscription(JointState, f"/robot{i}/arm_cmd", lambda msg: None, qos_profile("reliable", 10))
            for i in range(n)
        ]
        # the baseline's publishers: same type and QoS, same subscribers' topics
        self.plain_publishers = [
            node.create_publisher(JointState, f"/robot{i}/arm_cmd", qos_profile("reliable", 10)) for i in range(n)
        ]
        self.prebuilt = JointState(name=list(JOINTS))
        self.prebuilt.position = [0.1] * len(JOINTS)
        rng = np.random.default_rng(n)
        actions = rng.uniform(-1, 1, size=(HORIZON, n, len(JOINTS))).astype("<f4")
        self.frame = packb(
            {"message_type": "action", "data": {"env_ids": np.arange(n, dtype="<i8"), "action": actions}}
        )
        self.metadata = packb(
            {
                "message_type": "metadata",
                "data": {"protocol_version": 1, "action_horizon": HORIZON, "action_dim": len(JOINTS)},
            }
        )
        self.row = ObservationRow(states={"joints": np.zeros(len(JOINTS))})

    def matched(self) -> bool:
        return all(p.get_subscription_count() >= 1 for p in self.plain_publishers)

    def rollout_awaiting_action(self) -> Any:
        """A rollout whose infer for every env is out: the next frame it reads is the action."""
        from plugrl_ros.rollout.rollout import Rollout

        rollout = Rollout(self.settings, clock=time.monotonic)
        rollout.on_connected(1)
        rollout.on_frame(1, self.metadata)
        outgoing = rollout.poll(lambda env: self.row)
        assert len(outgoing) == 1 and outgoing[0].kind == "infer"
        return rollout

    def stamp(self) -> Any:
        return self.node.get_clock().now().to_msg()


def measure(paths: dict[int, ActionPath], repeat: int) -> list[dict[str, Any]]:
    import msgpack

    keys = ("first", "all", "tick", "plain_decode", "plain_publish_one", "plain_publish_all")
    samples = {n: {k: [] for k in keys} for n in paths}
    for round_index in range(repeat + 1):
        for n, path in paths.items():
            for _ in range(5):
                rollout = path.rollout_awaiting_action()
                t0 = time.perf_counter()
                result = rollout.on_frame(1, path.frame)
                stamp = path.stamp()
                first = None
                for env in result.envs:
                    path.ios[env].publish(rollout.take_step(env), stamp)
                    if first is None:
                        first = time.perf_counter()
                t1 = time.perf_counter()
                for env in range(n):
                    rollout.finish_step(env, 0.0, False, False, False, path.row)
                t2 = time.perf_counter()
                stamp = path.stamp()
                for env in range(n):
                    path.ios[env].publish(rollout.take_step(env), stamp)
                t3 = time.perf_counter()
                msgpack.unpackb(path.frame, raw=False, strict_map_key=False)
                t4 = time.perf_counter()
                for publisher in path.plain_publishers:
                    publisher.publish(path.prebuilt)
                    if publisher is path.plain_publishers[0]:
                        t5 = time.perf_counter()
                t6 = time.perf_counter()
                if round_index == 0:
                    continue
                s = samples[n]
                s["first"].append(first - t0)
                s["all"].append(t1 - t0)
                s["tick"].append(t3 - t2)
                s["plain_decode"].append(t4 - t3)
                s["plain_publish_one"].append(t5 - t4)
                s["plain_publish_all"].append(t6 - t4)
    return [{"n": n, **{k: common.median(v) for k, v in samples[n].items()}} for n in paths]


def tables(results: dict[str, Any]) -> str:
    head = (
        "n",
        "first actuator msg µs",
        "all n µs",
        "baseline first µs",
        "baseline all µs",
        "first/baseline",
        "all/baseline",
        "later tick, n envs µs",
        "per env µs",
    )
    body = []
    for r in results["rows"]:
        base_first = r["plain_decode"] + r["plain_publish_one"]
        base_all = r["plain_decode"] + r["plain_publish_all"]
        body.append(
            (
                r["n"],
                common.fmt_us(r["first"]),
                common.fmt_us(r["all"]),
                common.fmt_us(base_first),
                common.fmt_us(base_all),
                common.fmt_ratio(r["first"] / base_first),
                common.fmt_ratio(r["all"] / base_all),
                common.fmt_us(r["tick"]),
                common.fmt_us(r["all"] / r["n"]),
            )
        )
    title = f"### Action path (action frame H={HORIZON} x n x 14 float32 → JointState actuator messages published)"
    return title + "\n\n" + common.md_table(head, body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_arguments(parser, repeat=15)
    args = parser.parse_args()
    common.use_own_domain()
    common.tune_like_the_bridge()
    import rclpy
    from rclpy.node import Node

    rclpy.init()
    node = Node("plugrl_bench_action")
    try:
        counts = (1, 4) if args.quick else ENV_COUNTS
        paths = {n: ActionPath(node, n) for n in counts}
        common.wait_for(lambda: all(p.matched() for p in paths.values()), 10.0, "the subscribers to match")
        rows = measure(paths, 1 if args.quick else args.repeat)
        results = {"rows": rows, "horizon": HORIZON}
        print(tables(results))
        common.save_json(args.json, "action", results)
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
