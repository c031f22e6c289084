"""Lockstep throughput: env steps per second of the probe robot through the bridge, against a plain client.

Run: ``python bench/bench_throughput.py [--quick] [--seconds S] [--json PATH]``.

Three clients step the probe environment (docs/protocol.md) against the same
``bench_trainer.py`` (chunks of 4 steps, 2-wide actions, reuse offered):

* bridge: the probe robot and the bridge as ROS processes in lockstep
  (exactly ``plugrl-probe --mode lockstep``): every step is an action
  message to the robot and four messages back, across processes;
* headless: the same rollout core and websockets client with the probe envs
  in-process, no ROS (``plugrl-probe --headless``);
* baseline: ``baseline_client.py``, the probe envs in-process stepped by a
  plain Python loop;
* ros-floor: ``ros_lockstep_client.py``, the probe robot stepped by a bare
  rclpy node with no trainer: the bound that rclpy and DDS put on any ROS
  client of the probe robot. On the bridge's executor (the EventsExecutor);
  ``ros-floor-single`` and ``bridge-single`` run both on rclpy's
  SingleThreadedExecutor, for the comparison.

Steps are counted by the trainer from the probe's ``t`` in each feedback,
over a steady-state window. Also reported: bytes on the wire per env step
(with and without the reuse feature) and the CPU and memory of the bridge
and probe robot processes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

ENV_COUNTS = (1, 4, 16)
# the rclpy executor of the bridge and of the ROS floor, by the kind's suffix
EXECUTORS = {"": "events", "-single": "single", "-events": "events"}
HORIZON = 4
ACTION_DIM = 2


def client_children(kind: str, uri: str, n: int, reuse: bool) -> list[list[str]]:
    robot = common.python_module("plugrl_ros.tools.probe_robot", "--envs", str(n), "--action-dim", str(ACTION_DIM))
    if kind.startswith("ros-floor"):
        executor = EXECUTORS[kind.removeprefix("ros-floor")]
        floor = common.python_script("ros_lockstep_client.py", "--envs", str(n), "--executor", executor)
        return [robot, floor]
    if kind == "baseline":
        return [common.python_script("baseline_client.py", "--server", uri, "--envs", str(n))]
    if kind == "headless":
        args = ["--headless", "--server", uri, "--envs", str(n), "--quiet"] + ([] if reuse else ["--no-reuse"])
        return [common.python_module("plugrl_ros.tools.probe", *args)]
    from plugrl_ros.shipped import shipped_file
    from plugrl_ros.tools.probe import build_parser
    from plugrl_ros.tools.probe_deployment import bridge_command

    # plugrl-probe's own defaults for every option not given here
    options = build_parser().parse_args(
        ["--server", uri, "--envs", str(n), "--mode", "lockstep", "--rate", "50", "--quiet"]
        + ["--action-dim", str(ACTION_DIM)]
        + ([] if reuse else ["--no-reuse"])
    )
    return [robot, bridge_command(options, str(shipped_file("config", "probe.yaml")), "plugrl_bridge")]


def run_one(kind: str, n: int, reuse: bool, seconds: float, warmup: float) -> dict[str, Any]:
    with common.children() as started:
        trainer = common.TrainerChild("--horizon", str(HORIZON), "--action-dim", str(ACTION_DIM), "--reuse")
        started.append(trainer)
        env = common.ros_env()
        if kind.startswith("bridge"):
            env["PLUGRL_EXECUTOR"] = EXECUTORS[kind.removeprefix("bridge")]
        clients = [common.Child(command, env) for command in client_children(kind, trainer.uri, n, reuse)]
        started.extend(clients)
        # the ROS floor has no trainer: its client counts its own steps
        counter = (lambda: common.last_json_line(clients[-1])) if kind.startswith("ros-floor") else trainer.stats
        wire, processes = common.measure_steps(counter, clients, 2 * n, seconds, warmup, kind)
    steps = wire["steps"]
    return {
        "kind": kind,
        "n": n,
        "reuse": reuse,
        "steps_per_s": steps / wire["t"],
        "bytes_per_step": wire["bytes_in"] / steps if steps and "bytes_in" in wire else float("nan"),
        "wire": wire,
        # the client process (the bridge, for kind "bridge") first
        "process": processes[-1],
        "cpu_percent_all": sum(p["cpu_percent"] for p in processes),
    }


def tables(results: dict[str, Any]) -> str:
    rows = results["rows"]
    base = {r["n"]: r["steps_per_s"] for r in rows if r["kind"] == "baseline"}
    floor = {r["n"]: r["steps_per_s"] for r in rows if r["kind"] == "ros-floor"}
    floor_single = {r["n"]: r["steps_per_s"] for r in rows if r["kind"] == "ros-floor-single"}
    head = (
        "client", "n", "reuse", "env steps/s", "vs baseline", "vs ROS floor", "vs floor (single)", "wire B/step",
        "CPU % (all)", "client RSS MB", "client CPU µs/step",
    )  # fmt: skip
    body = []
    for r in rows:
        ratio = r["steps_per_s"] / base[r["n"]] if r["n"] in base else float("nan")
        bridge = r["kind"].startswith("bridge")
        ros = r["steps_per_s"] / floor[r["n"]] if r["n"] in floor and bridge else float("nan")
        single = r["steps_per_s"] / floor_single[r["n"]] if r["n"] in floor_single and bridge else float("nan")
        cpu_per_step = r["process"]["cpu_percent"] / 100 / r["steps_per_s"] if r["steps_per_s"] else float("nan")
        wire = r["bytes_per_step"]
        body.append(
            (
                r["kind"],
                r["n"],
                "-" if r["kind"].startswith("ros-floor") or r["kind"] == "baseline" else "on" if r["reuse"] else "off",
                f"{r['steps_per_s']:,.0f}",
                common.fmt_ratio(ratio),
                common.fmt_ratio(ros),
                common.fmt_ratio(single),
                "-" if wire != wire else f"{wire:,.0f}",
                f"{r['cpu_percent_all']:.0f}",
                f"{r['process']['rss_mb']:.0f}",
                common.fmt_us(cpu_per_step),
            )
        )
    title = (
        f"### Lockstep throughput (probe envs, chunks of {HORIZON}; bridge and ros-floor = probe robot + client "
        "processes, CPU % summed over both)"
    )
    note = (
        "\n\nros-floor = the probe robot stepped by a bare rclpy node (no trainer, no bridge logic) on the "
        "bridge's executor (the EventsExecutor): the most an rclpy client of the probe robot reaches here; "
        "-single: the same node and the bridge on the SingleThreadedExecutor. The floor has no trainer: the "
        "bridge's ratio includes the trainer round trip of every chunk. client CPU µs/step = CPU of the client "
        "process alone (for the bridge: the bridge, not the robot) per env step. The baseline sends no reuse."
    )
    return title + "\n\n" + common.md_table(head, body) + note


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_arguments(parser, repeat=1)
    parser.add_argument("--seconds", type=float, default=8.0, help="measurement window per run")
    args = parser.parse_args()
    if args.quick:
        runs = [("baseline", 2, True), ("headless", 2, True), ("ros-floor", 2, True), ("bridge", 2, True)]
        seconds, warmup = 1.5, 0.5
    else:
        kinds = ("baseline", "headless", "ros-floor", "ros-floor-single", "bridge", "bridge-single")
        runs = [(kind, n, True) for n in ENV_COUNTS for kind in kinds]
        runs.append(("bridge", 4, False))
        seconds, warmup = args.seconds, 3.0
    rows = [run_one(kind, n, reuse, seconds, warmup) for kind, n, reuse in runs]
    results = {"rows": rows, "horizon": HORIZON}
    print(tables(results))
    common.save_json(args.json, "throughput", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
