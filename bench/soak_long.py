"""The long soak: the demo with recording on, for hours, with faults on a schedule; does any process grow?

Opt-in (never run by the test suite; two hours is the documented run)::

    source scripts/env.sh && python bench/soak_long.py --minutes 120

What runs, all as real processes: the demo robot (two reachers, timer mode, 20 Hz), the demo trainer,
and the bridge configured by config/demo.yaml with ``record.path`` set (rotation as configured by
default). Every ``--fault-every-min`` minutes one fault, in turn:

* **trainer restart**: the trainer is killed (SIGKILL: a crash, no close frame) and started again on the
  same port; the bridge reconnects;
* **link cut**: as root, iptables drops the trainer port's packets on loopback for ``--cut-s`` seconds
  (the bridge's TCP timeout notices; it reconnects once the cut ends); skipped, and said, without root;
* **robot restart**: the robot node is stopped (SIGINT) and started again; the bridge's sources go stale,
  its envs idle, then resume.

Every ``--sample-s`` seconds: each process's RSS, threads and open file descriptors (psutil), and the
recording's files and bytes. At the end: the table, the bridge's RSS slope after ``--warmup-min`` (a
least-squares line, MiB per hour), the bridge's own count of recorder calls dropped, and a plot of the
three processes' RSS with the faults marked.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Child, bridge_command, md_table, python_module, ros_env, wait_for  # noqa: E402

FAULTS = ("trainer restart", "link cut", "robot restart")
DEMO = ROOT / "config" / "demo.yaml"


@dataclass
class Sample:
    minute: float
    fault: str  # the fault made since the last sample ("" if none)
    bridge_mib: float
    bridge_threads: int
    bridge_fds: int
    robot_mib: float
    trainer_mib: float
    record_files: int
    record_mib: float


def _usage(pid: int) -> tuple[float, int, int]:
    import psutil

    try:
        process = psutil.Process(pid)
        return process.memory_info().rss / 2**20, process.num_threads(), process.num_fds()
    except psutil.NoSuchProcess:
        return float("nan"), 0, 0


def _iptables(action: str, port: int) -> None:
    for rule in (["--dport", str(port)], ["--sport", str(port)]):
        subprocess.run(["iptables", action, "INPUT", "-i", "lo", "-p", "tcp", *rule, "-j", "DROP"], check=True)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.record = args.output / "recording"
        self.env = ros_env(ROS_DOMAIN_ID=args.domain)
        self.robot = self._robot()
        self.trainer = self._trainer()
        time.sleep(2.0)
        self.bridge = Child(
            bridge_command(
                None,
                *("--ros-args", "--params-file", str(DEMO)),
                *("-p", f"trainer.uri:=ws://127.0.0.1:{args.port}", "-p", "control.mode:=timer"),
                *("-p", "envs:=['reacher0', 'reacher1']", "-p", f"record.path:={self.record}"),
            ),
            env=self.env,
        )
        self.faults: list[tuple[float, str]] = []

    def _robot(self) -> Child:
        command = python_module("plugrl_ros.demo.robot_node", "--envs", "2", "--mode", "timer", "--rate", "20")
        return Child(command, env=self.env)

    def _trainer(self) -> Child:
        command = python_module(
            "plugrl_ros.demo.trainer", "--port", str(self.args.port), "--duration", "1e9", "--horizon", "5"
        )
        return Child(command, env=self.env)

    def fault(self, kind: str) -> str:
        if kind == "trainer restart":
            self.trainer.proc.kill()  # a crash: no close frame
            self.trainer.proc.wait()
            self.trainer = self._trainer()
            return kind
        if kind == "link cut":
            if os.geteuid() != 0:
                return "link cut skipped (not root)"
            _iptables("-I", self.args.port)
            try:
                time.sleep(self.args.cut_s)
            finally:
                _iptables("-D", self.args.port)
            return kind
        self.robot.stop()
        time.sleep(3.0)
        self.robot = self._robot()
        return kind

    def sample(self, started: float, fault: str) -> Sample:
        bridge_mib, threads, fds = _usage(self.bridge.pid)
        files = sorted(self.record.glob("*.mcap"))
        return Sample(
            minute=round((time.monotonic() - started) / 60.0, 2),
            fault=fault,
            bridge_mib=round(bridge_mib, 1),
            bridge_threads=threads,
            bridge_fds=fds,
            robot_mib=round(_usage(self.robot.pid)[0], 1),
            trainer_mib=round(_usage(self.trainer.pid)[0], 1),
            record_files=len(files),
            record_mib=round(sum(f.stat().st_size for f in files) / 2**20, 1),
        )

    def stop(self) -> str:
        self.bridge.stop(60.0)
        self.robot.stop()
        self.trainer.stop()
        return self.bridge.output()


def slope_mib_per_hour(samples: list[Sample], warmup_min: float, field: str) -> float | None:
    """The least-squares slope of ``field`` after the warm-up, in MiB per hour."""
    points = [(s.minute, getattr(s, field)) for s in samples if s.minute >= warmup_min]
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    cov = sum((t - mean_t) * (y - mean_y) for t, y in points)
    return 60.0 * cov / var if var else None


def plot(samples: list[Sample], faults: list[tuple[float, str]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 4.5))
    minutes = [s.minute for s in samples]
    for field, label in (("bridge_mib", "bridge"), ("robot_mib", "demo robot"), ("trainer_mib", "demo trainer")):
        axis.plot(minutes, [getattr(s, field) for s in samples], label=label)
    colours = dict(zip(FAULTS, ("tab:red", "tab:purple", "tab:gray"), strict=True))
    for minute, kind in faults:
        axis.axvline(minute, color=colours.get(kind, "black"), alpha=0.3, linewidth=1)
    axis.set_xlabel("minutes (vertical lines: faults; red trainer restart, purple link cut, grey robot restart)")
    axis.set_ylabel("RSS (MiB)")
    axis.set_title("The demo with recording, faults on a schedule: memory of each process")
    axis.legend(loc="center right")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=120.0, help="how long to run (default %(default)s)")
    parser.add_argument("--sample-s", type=float, default=60.0, help="sampling period (default %(default)s)")
    parser.add_argument("--fault-every-min", type=float, default=10.0, help="minutes between faults")
    parser.add_argument("--cut-s", type=float, default=30.0, help="how long a link cut lasts (default %(default)s)")
    parser.add_argument("--warmup-min", type=float, default=10.0, help="left out of the slope (default %(default)s)")
    parser.add_argument("--port", type=int, default=18790)
    parser.add_argument("--domain", default="96", help="ROS_DOMAIN_ID (default %(default)s)")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "soak_long")
    parser.add_argument("--plot", type=Path, default=None, help="the memory plot (default OUTPUT/memory.png)")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    soak = Soak(args)
    samples: list[Sample] = []
    started = time.monotonic()
    try:
        wait_for(lambda: "connected to the trainer" in soak.bridge.output(), 60.0, "the bridge's first connection")
        next_sample, next_fault, faults_made = started, started + 60.0 * args.fault_every_min, 0
        pending = ""
        while time.monotonic() - started < 60.0 * args.minutes and soak.bridge.alive():
            now = time.monotonic()
            if now >= next_fault:
                kind = FAULTS[faults_made % len(FAULTS)]
                said = soak.fault(kind)
                soak.faults.append((round((now - started) / 60.0, 2), kind))
                pending = f"{pending}, {said}" if pending else said
                faults_made += 1
                next_fault += 60.0 * args.fault_every_min
            if now >= next_sample:
                samples.append(soak.sample(started, pending))
                print(json.dumps(asdict(samples[-1])), flush=True)
                pending = ""
                next_sample += args.sample_s
            time.sleep(0.5)
    finally:
        output = soak.stop()
    (args.output / "bridge.log").write_text(output)
    print(md_table(list(asdict(samples[0])), [list(asdict(s).values()) for s in samples]) if samples else "")
    stopped = [line for line in output.splitlines() if "recording stopped" in line]
    summary = {
        "minutes": round((time.monotonic() - started) / 60.0, 1),
        "faults": soak.faults,
        "bridge_slope_mib_per_hour": slope_mib_per_hour(samples, args.warmup_min, "bridge_mib"),
        "robot_slope_mib_per_hour": slope_mib_per_hour(samples, args.warmup_min, "robot_mib"),
        "bridge_threads": [min(s.bridge_threads for s in samples), max(s.bridge_threads for s in samples)],
        "bridge_fds": [min(s.bridge_fds for s in samples), max(s.bridge_fds for s in samples)],
        "recording_stopped": stopped[-1] if stopped else "(no 'recording stopped' line)",
        "reconnects_logged": output.count("connected to the trainer") - 1,
        "bridge_exit_clean": "Traceback" not in output,
    }
    (args.output / "soak.json").write_text(json.dumps({"summary": summary, "samples": [asdict(s) for s in samples]}))
    print(json.dumps(summary, indent=1))
    plot(samples, soak.faults, args.plot or args.output / "memory.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
