"""Control timing: how regularly a timer-mode bridge publishes while it streams two 640x480 cameras to a trainer.

Run: ``python bench/bench_timing.py [--quick] [--seconds S] [--json PATH]``.

Real processes over DDS: ``sensor_node.py`` (two 640x480 rgb8 cameras at
30 Hz and a 14-joint JointState at 100 Hz), the bridge (``python -m
plugrl_ros.node.bridge_main``, timer mode, one env, a 14-joint JointState
actuator whose idle is ``zero`` so every tick publishes), and
``bench_trainer.py`` (chunks of 8 steps, reuse offered). This process
subscribes to the actuator and reads each message's header stamp, which the
bridge takes on the tick just before publishing: the intervals between
stamps are the intervals between publications, free of DDS delivery jitter
(receive-time intervals are shown too).

``--record`` runs each case with recording off and on (``record.path``; the
bridge CPU column is the bridge process alone, not its writer process);
``--camera-hz`` sets the cameras' rate; ``--baseline REV`` runs each case
also with the bridge of an earlier commit (taken from git), interleaved, and
prints the bridge CPU of both side by side.

Reported per rate: the deviation of each interval from the period (median,
p99, max), late ticks (an interval over 1.5 periods), missed ticks (rcl
drops a tick more than a period late), and drift: how far the schedule's
grid moved between the start and the end of the window. Beside the bridge
runs ``timer_node.py``, a bare rclpy timer at the same rate: the floor of
timing precision under the machine's load at that moment. Also the bridge
process's CPU, memory and page faults, and the bytes on the wire per env
step.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from bench_observation import bridge_params
from bench_step_rate import extract

HORIZON = 8
ACTION_DIM = 14
TARGET_P99_MS = 2.0
# (rate Hz, camera kind, reuse offered)
RUNS = (
    (50.0, "raw640", True),
    (100.0, "raw640", True),
    (200.0, "raw640", True),
    (100.0, "jpeg640", True),
    (100.0, "raw640", False),
)
QUICK_RUNS = ((100.0, "raw640", True),)


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


class Recorder:
    """Header stamps and arrival times of JointState messages on some topics, from a node spun on a thread."""

    def __init__(self, topics: list[str]) -> None:
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.node import Node
        from sensor_msgs.msg import JointState

        from plugrl_ros.ros.qos import qos_profile

        self.samples: dict[str, list[tuple[int, int]]] = {topic: [] for topic in topics}
        self.node = Node("plugrl_bench_recorder")
        for topic in topics:
            self.node.create_subscription(
                JointState, topic, self._on_message(self.samples[topic]), qos_profile("reliable", 100)
            )
        self._executor = SingleThreadedExecutor()
        self._executor.add_node(self.node)
        self._thread = threading.Thread(target=self._executor.spin, daemon=True)
        self._thread.start()

    @staticmethod
    def _on_message(samples: list[tuple[int, int]]) -> Any:
        def callback(msg: Any) -> None:
            stamp = msg.header.stamp
            samples.append((stamp.sec * 1_000_000_000 + stamp.nanosec, time.time_ns()))

        return callback

    def close(self) -> None:
        self._executor.shutdown()
        self._thread.join(5.0)
        self.node.destroy_node()


def interval_stats(times_ns: list[int], period_s: float) -> dict[str, float]:
    period_ns = period_s * 1e9
    intervals = [b - a for a, b in itertools.pairwise(times_ns)]
    deviations = [abs(i - period_ns) / 1e6 for i in intervals]
    late = sum(1 for i in intervals if i > 1.5 * period_ns)
    expected = round((times_ns[-1] - times_ns[0]) / period_ns) + 1 if times_ns else 0
    missed = expected - len(times_ns)
    # The n-th publication should be at first + n * period. A missed tick is
    # counted above; drift is the schedule itself moving: the distance of
    # each publication from the nearest point of the first one's grid, at the
    # end of the window against the start.
    phase = [((t - times_ns[0] + period_ns / 2) % period_ns - period_ns / 2) / 1e6 for t in times_ns]
    tenth = max(1, len(phase) // 10)
    return {
        "count": float(len(times_ns)),
        "median_dev_ms": common.median(deviations),
        "p99_dev_ms": common.percentile(deviations, 0.99),
        "max_dev_ms": max(deviations, default=float("nan")),
        "missed": float(missed),
        "late": float(late),
        "drift_ms": common.median(phase[-tenth:]) - common.median(phase[:tenth]) if phase else float("nan"),
    }


def run_one(
    rate: float,
    camera: str,
    reuse: bool,
    seconds: float,
    warmup: float,
    workdir: Path,
    record: bool = False,
    camera_hz: float = 30.0,
    tree: Path | None = None,
) -> dict[str, Any]:
    """One measurement window; ``tree``: run the bridge of that source tree (an earlier commit) instead."""
    trainer_args = ["--horizon", str(HORIZON), "--action-dim", str(ACTION_DIM)] + (["--reuse"] if reuse else [])
    with common.children() as started:
        trainer = common.TrainerChild(*trainer_args)
        started.append(trainer)
        sensors = ("--envs", "1", "--camera", camera, "--camera-hz", f"{camera_hz:g}")
        started.append(common.Child(common.python_script("sensor_node.py", *sensors)))
        params = bridge_params(camera, 1)
        params.update({"trainer.uri": trainer.uri, "control.rate_hz": rate, "trainer.use_reuse": reuse})
        if record:
            params["record.path"] = str(workdir / f"recording-{rate:g}-{camera}-{reuse}")
        config = common.write_params(workdir / f"timing-{rate:g}-{camera}-{reuse}-{record}.yaml", nest(params))
        recorder = Recorder(["/robot0/arm_cmd", "/reference/arm_cmd"])
        try:
            started.append(common.Child(common.python_script("timer_node.py", "--rate", f"{rate:g}")))
            # the CPU floor: a bare rclpy node receiving the same sensors and publishing at the same rate
            floor = common.Child(
                common.python_script(
                    "timer_node.py", "--rate", f"{rate:g}", "--topic", "floor/arm_cmd", "--listen", "robot0",
                    "--camera", camera,
                )
            )  # fmt: skip
            started.append(floor)
            command = common.bridge_command(tree, "--ros-args", "--params-file", str(config))
            # python -m puts the working directory first: the bridge imports plugrl_ros from ``tree``
            extra = {} if tree is None else {"env": common.ros_env(PYTHONPATH=str(tree)), "cwd": str(tree)}
            bridge = common.Child(command, **extra)
            started.append(bridge)
            common.wait_for(lambda: trainer.stats()["feedbacks"] > 2, 30.0, "the bridge's first feedbacks")
            time.sleep(warmup)
            meter = common.ProcessMeter(bridge.pid)
            floor_meter = common.ProcessMeter(floor.pid)
            before = trainer.stats()
            meter.start()
            floor_meter.start()
            start_ns = time.time_ns()
            time.sleep(seconds)
            end_ns = time.time_ns()
            process = meter.stop()
            floor_process = floor_meter.stop()
            load = os.getloadavg()[0]
            wire = common.difference(trainer.stats(), before)
            if not bridge.alive():
                raise RuntimeError("the bridge exited:\n" + bridge.output()[-3000:])
        finally:
            recorder.close()
    window = [s for s in recorder.samples["/robot0/arm_cmd"] if start_ns <= s[0] <= end_ns]
    stamps = [s[0] for s in window]
    arrivals = [s[1] for s in window]
    reference = [s[0] for s in recorder.samples["/reference/arm_cmd"] if start_ns <= s[0] <= end_ns]
    period = 1.0 / rate
    steps = wire["feedback_rows"] * HORIZON
    return {
        "rate": rate,
        "camera": camera,
        "reuse": reuse,
        "record": record,
        "camera_hz": camera_hz,
        "code": "before" if tree is not None else "after",
        "window_s": (end_ns - start_ns) / 1e9,
        "stamps": interval_stats(stamps, period),
        "arrivals": interval_stats(arrivals, period),
        "reference": interval_stats(reference, period),
        "process": process,
        "floor_process": floor_process,
        "wire": wire,
        "bytes_per_step": wire["bytes_in"] / steps if steps else float("nan"),
        "load": load,
        "intervals_ms": [(b - a) / 1e6 for a, b in itertools.pairwise(stamps)],
    }


def tables(results: dict[str, Any]) -> str:
    head = (
        "code",
        "rate Hz",
        "cameras",
        "reuse",
        "recording",
        "publications",
        "median dev ms",
        "p99 dev ms",
        "max dev ms",
        "late",
        "missed",
        "drift ms",
        "p99 dev ms (arrival)",
        "reference: p99 / max dev ms, late",
        "bridge CPU %",
        "floor CPU %",
        "RSS MB",
        "faults/s",
        "wire kB/step",
        "load avg",
    )
    body = []
    for r in results["rows"]:
        s, a, p, ref = r["stamps"], r["arrivals"], r["process"], r["reference"]
        body.append(
            (
                r.get("code", "after"),
                f"{r['rate']:g}",
                f"2x {r['camera']} at {r.get('camera_hz', 30.0):g} Hz",
                "on" if r["reuse"] else "off",
                "on" if r.get("record") else "off",
                int(s["count"]),
                f"{s['median_dev_ms']:.3f}",
                f"{s['p99_dev_ms']:.2f}",
                f"{s['max_dev_ms']:.2f}",
                int(s["late"]),
                int(s["missed"]),
                f"{s['drift_ms']:.3f}",
                f"{a['p99_dev_ms']:.2f}",
                f"{ref['p99_dev_ms']:.2f} / {ref['max_dev_ms']:.2f}, {int(ref['late'])}",
                f"{p['cpu_percent']:.0f}",
                f"{r['floor_process']['cpu_percent']:.0f}" if "floor_process" in r else "-",
                f"{p['rss_mb']:.0f}",
                f"{p['faults_per_s']:,.0f}",
                f"{r['bytes_per_step'] / 1e3:,.0f}",
                f"{r.get('load', 0):.1f}",
            )
        )
    title = (
        "### Control timing (timer mode, 1 env, 2 cameras (rate in the table) + 14-joint JointState at 100 Hz, "
        f"chunks of {HORIZON})"
    )
    note = (
        "\n\ndev = |interval - period| between successive publications (header stamps); late = intervals "
        "over 1.5 periods; missed = ticks that never came (rcl keeps the schedule's grid: a tick more than a "
        "period late is dropped, not shifted); drift = how far the "
        "schedule's grid moved over the window. reference = a bare rclpy timer node publishing at the same "
        "rate, at the same time, on the same machine: the floor of timing precision under the load of the moment. "
        "floor CPU % = another bare rclpy node (the bridge's executor) that receives the same cameras and joint "
        "states serialized, with the bridge's QoS, and publishes at the same rate: the CPU any rclpy node "
        "receiving those sensors spends."
    )
    return title + "\n\n" + common.md_table(head, body) + note + cpu_comparison(results["rows"])


def cpu_comparison(rows: list[dict[str, Any]]) -> str:
    """Bridge CPU of this code and of the baseline, per case: medians over the rounds, and their ratio.

    On an overloaded machine the bridge misses ticks, and CPU % falls with the
    work not done: the CPU per publication, scaled to the rate (what CPU % would
    be with every tick made), is shown beside it.
    """
    if not any(r.get("code") == "before" for r in rows):
        return ""
    cases: dict[tuple, dict[str, list[tuple[float, float]]]] = {}
    for r in rows:
        key = (r["rate"], r["camera"], r["reuse"], bool(r.get("record")))
        publications_per_s = r["stamps"]["count"] / r["window_s"] if r.get("window_s") else float("nan")
        per_tick = r["process"]["cpu_percent"] / publications_per_s * r["rate"] if publications_per_s else float("nan")
        cases.setdefault(key, {"after": [], "before": []})[r.get("code", "after")].append(
            (r["process"]["cpu_percent"], per_tick)
        )
    head = (
        "rate Hz",
        "cameras",
        "reuse",
        "recording",
        "CPU % after (runs)",
        "before (runs)",
        "after/before",
        "CPU % per tick x rate: after",
        "before",
        "after/before",
    )
    body = []
    for (rate, camera, reuse, record), runs in cases.items():
        cells = [f"{rate:g}", camera, "on" if reuse else "off", "on" if record else "off"]
        for k in (0, 1):
            after = common.median([run[k] for run in runs["after"]])
            before = common.median([run[k] for run in runs["before"]])
            cells += [
                f"{after:.1f} ({', '.join(f'{run[k]:.0f}' for run in runs['after'])})",
                f"{before:.1f} ({', '.join(f'{run[k]:.0f}' for run in runs['before'])})",
                f"{after / before:.2f}" if before else "-",
            ]
        body.append(tuple(cells))
    return "\n\n### Bridge CPU, this code against the baseline (interleaved runs)\n\n" + common.md_table(head, body)


def verdict(results: dict[str, Any]) -> list[str]:
    runs = [
        r
        for r in results["rows"]
        if r["rate"] == 100.0
        and r["camera"] == "raw640"
        and r["reuse"]
        and not r.get("record")
        and r.get("code", "after") == "after"
    ]
    if not runs:
        return []
    p99 = common.median([r["stamps"]["p99_dev_ms"] for r in runs])
    reference = common.median([r["reference"]["p99_dev_ms"] for r in runs])
    missed = sum(int(r["stamps"]["missed"]) for r in runs)
    drift = max(abs(r["stamps"]["drift_ms"]) for r in runs)
    ok = p99 < TARGET_P99_MS and missed == 0 and drift < 0.1
    return [
        f"p99 deviation under {TARGET_P99_MS:g} ms at 100 Hz, no drift: {'met' if ok else 'missed'} "
        f"(median over {len(runs)} runs: p99 {p99:.2f} ms; {missed} ticks missed in all; drift at most "
        f"{drift:.3f} ms; the bare rclpy timer beside it: p99 {reference:.2f} ms)"
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_arguments(parser, repeat=3)
    parser.add_argument("--seconds", type=float, default=None, help="measurement window per run (default 12)")
    parser.add_argument("--runs", default="", help="only these runs, e.g. 100:raw640:on,200:jpeg640:off")
    parser.add_argument(
        "--record", action="store_true", help="each run twice, recording off and on (record.path), side by side"
    )
    parser.add_argument("--camera-hz", type=float, default=30.0, help="the cameras' rate (default %(default)s)")
    parser.add_argument("--baseline", default="", help="also run the bridge of this git revision, interleaved")
    args = parser.parse_args()
    common.use_own_domain()
    import rclpy

    rclpy.init()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="plugrl-bench-") as tmp:
            trees: list[Path | None] = [None]
            if args.baseline:
                (Path(tmp) / "baseline").mkdir()
                baseline = extract(args.baseline, Path(tmp) / "baseline")
                if baseline is None:
                    raise SystemExit(f"--baseline {args.baseline}: git could not give that revision's plugrl_ros")
                trees.append(baseline)
            runs = QUICK_RUNS if args.quick else RUNS
            if args.runs:
                runs = tuple(
                    (float(rate), camera, reuse == "on")
                    for rate, camera, reuse in (r.split(":") for r in args.runs.split(","))
                )
            seconds = args.seconds or (2.0 if args.quick else 12.0)
            warmup = 1.0 if args.quick else 3.0
            # rounds of every run, so that a burst of load from a neighbour spoils one run of a kind, not all
            for round_index in range(1 if args.quick else args.repeat):
                for rate, camera, reuse in runs:
                    for record in (False, True) if args.record else (False,):
                        for tree in trees:
                            row = run_one(rate, camera, reuse, seconds, warmup, Path(tmp), record, args.camera_hz, tree)
                            rows.append({**row, "round": round_index})
    finally:
        rclpy.try_shutdown()
    rows.sort(
        key=lambda r: (
            r["camera"] != "raw640",
            not r["reuse"],
            r["rate"],
            r["round"],
            r["record"],
            r["code"] != "after",
        )
    )
    results: dict[str, Any] = {"rows": rows}
    results["verdict"] = verdict(results)
    print(tables(results))
    print()
    print("targets: " + "; ".join(results["verdict"]))
    common.save_json(args.json, "timing", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
