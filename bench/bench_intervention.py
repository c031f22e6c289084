"""SAC on the demo reachers with a person in the loop: alone, corrected by a person, and seeded with demonstrations.

Run: ``python bench/bench_intervention.py [--quick] [--seeds 0 1 2] [--duration 240] [--teleop-minutes 2]
[--demo-minutes 5] [--output bench-output/intervention] [--json PATH] [--plot PNG]`` (needs the rllib extra:
``scripts/setup-venv.sh .venv kilted "" rllib``; ``OMP_NUM_THREADS=1`` on a small machine).

Every run is ``plugrl-demo --trainer rllib --algorithm SAC`` (a process of its
own: the demo robot with two reachers in timer mode at 20 Hz, stepping in real
time, the bridge, RLlib's SAC through the runner; no deploy step), one of three
variants, on the same seeds:

* ``sac``: SAC alone;
* ``sac+person``: with ``--teleop scripted``: a scripted person at a gamepad
  takes over a reacher whose arm strays, during the first ``--teleop-minutes``;
* ``sac+person+demos``: the same, with ``--demonstrations``: ``--demo-minutes``
  of a scripted demonstrator driving the reachers in teleop mode (recorded once,
  exported with ``plugrl-export --to rllib``), a quarter of every batch drawn
  from them.

It reports, per wall-clock minute of training and variant, the success rate
(episodes that ended on the target, terminated before ``episode.max_steps``,
over all episodes that ended in that minute; mean and spread over the seeds)
and the person's share of the steps. Runs whose ``summary.json`` exists in the
output folder are read, not run again (a benchmark interrupted goes on).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import DEMONSTRATOR, md_table, record_demo_teleop, ros_env

from plugrl_ros import executables
from plugrl_ros.shipped import shipped_file

VARIANTS = ("sac", "sac+person", "sac+person+demos")
MAX_STEPS = 60  # config/demo.yaml's episode.max_steps at 20 Hz: an episode this long ran out of time


def demo_command(variant: str, seed: int, args: argparse.Namespace, output: Path, demos: Path) -> list[str]:
    command = executables.command(
        "plugrl_ros.demo.runner",
        *("--trainer", "rllib", "--algorithm", "SAC", "--mode", "timer", "--seed", str(seed)),
        *("--duration", repr(float(args.duration)), "--deploy-duration", "0", "--no-record", "--output", str(output)),
    )
    if variant != "sac":
        command += ["--teleop", "scripted", "--teleop-minutes", repr(float(args.teleop_minutes))]
    if variant == "sac+person+demos":
        command += ["--demonstrations", str(demos)]
    return command


def record_demonstrations(folder: Path, minutes: float) -> Path:
    """``minutes`` of a scripted demonstrator in teleop mode on the demo reachers, exported for RLlib."""
    demos = folder / "rllib"
    if any(demos.glob("*.parquet")):
        return demos
    recording = folder / "recording"
    config = shipped_file("config", "demo.yaml")
    folder.mkdir(parents=True, exist_ok=True)
    code = record_demo_teleop(recording, 60.0 * minutes, *DEMONSTRATOR, seed=100, log=folder / "demonstrations.log")
    if code != 0:
        sys.exit(f"bench_intervention: the teleop bridge exited with {code}; see {folder / 'demonstrations.log'}")
    export = executables.command(
        "plugrl_ros.record.export",
        *[str(p) for p in sorted(recording.glob("*.mcap"))],
        *("--to", "rllib", "--output", str(demos), "--config", str(config), "--images", ""),
    )
    done = subprocess.run(export, capture_output=True, text=True, check=False, env=ros_env())
    if done.returncode != 0:
        sys.exit(f"bench_intervention: the export failed: {done.stderr}")
    print(f"demonstrations ({minutes:g} min): {done.stdout.strip()}", flush=True)
    return demos


def run(variant: str, seed: int, args: argparse.Namespace, demos: Path) -> Path:
    output = args.output / f"{variant}-seed{seed}"
    if (output / "summary.json").is_file():
        return output
    started = time.monotonic()
    command = demo_command(variant, seed, args, output, demos)
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=ros_env())
    if done.returncode != 0:
        sys.exit(f"bench_intervention: {variant} seed {seed} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    print(f"{variant} seed {seed}: {time.monotonic() - started:.0f} s", flush=True)
    return output


def by_minute(output: Path, minutes: int) -> dict[str, list[float | None]]:
    """One run's success rate and the person's share, minute by minute."""
    ended: list[list[bool]] = [[] for _ in range(minutes)]
    with open(output / "episodes.csv") as f:
        for row in csv.DictReader(f):
            minute = int(float(row["time_s"]) // 60.0)
            if minute < minutes:
                ended[minute].append(int(row["length"]) < MAX_STEPS)
    summary = json.loads((output / "summary.json").read_text())
    shares = summary.get("intervention", {}).get("share_by_minute", [])
    return {
        "success": [sum(e) / len(e) if e else None for e in ended],
        "person_share": [shares[m] if m < len(shares) else None for m in range(minutes)] if shares else [0.0] * minutes,
        "episodes": [len(e) for e in ended],
    }


def spread(values: list[float | None]) -> tuple[float | None, float | None, float | None]:
    known = [v for v in values if v is not None]
    if not known:
        return None, None, None
    return statistics.fmean(known), min(known), max(known)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 seed, 20 s each, 20 s of demonstrations")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--duration", type=float, default=240.0, help="seconds of training per run")
    parser.add_argument("--teleop-minutes", type=float, default=2.0, help="the person helps this long")
    parser.add_argument("--demo-minutes", type=float, default=5.0, help="minutes of demonstrations recorded")
    parser.add_argument("--output", type=Path, default=Path("bench-output/intervention"))
    parser.add_argument("--json", type=Path, help="write the table's figures here")
    parser.add_argument("--plot", type=Path, help="draw success rate and person share against minutes here")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.duration, args.teleop_minutes, args.demo_minutes = [0], 20.0, 0.2, 1.0 / 3.0
    minutes = max(1, round(args.duration / 60.0))
    demos = record_demonstrations(args.output / "demonstrations", args.demo_minutes)
    results: dict[str, list[dict[str, Any]]] = {}
    for seed in args.seeds:
        for variant in VARIANTS:
            results.setdefault(variant, []).append(by_minute(run(variant, seed, args, demos), minutes))
    table: dict[str, Any] = {"minutes": minutes, "seeds": args.seeds, "variants": {}}
    rows = []
    for variant, runs in results.items():
        success = [spread([r["success"][m] for r in runs]) for m in range(minutes)]
        share = [spread([r["person_share"][m] for r in runs]) for m in range(minutes)]
        table["variants"][variant] = {"success": success, "person_share": share, "runs": runs}
        for m in range(minutes):
            s, p = success[m], share[m]
            rows.append(
                [
                    variant,
                    f"{m + 1}",
                    "-" if s[0] is None else f"{s[0]:.0%} ({s[1]:.0%}-{s[2]:.0%})",
                    "-" if p[0] is None else f"{p[0]:.0%}",
                    str(sum(r["episodes"][m] for r in runs)),
                ]
            )
    print(f"\nSAC on the demo reachers (timer, 20 Hz), {len(args.seeds)} seed(s): success rate by wall-clock minute")
    print(md_table(["variant", "minute", "success (mean, min-max over seeds)", "person share", "episodes"], rows))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    if args.plot:
        plot(table, args.plot)
    return 0


def plot(table: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=[2, 1])
    minutes = list(range(1, table["minutes"] + 1))
    for variant, figures in table["variants"].items():
        for axis, key in ((top, "success"), (bottom, "person_share")):
            mean = [float("nan") if s[0] is None else s[0] for s in figures[key]]
            low = [float("nan") if s[1] is None else s[1] for s in figures[key]]
            high = [float("nan") if s[2] is None else s[2] for s in figures[key]]
            (line,) = axis.plot(minutes, mean, marker="o", label=variant)
            axis.fill_between(minutes, low, high, color=line.get_color(), alpha=0.15)
    top.set_ylabel("success rate")
    top.set_title(f"SAC on the demo reachers, {len(table['seeds'])} seeds (mean; band: min-max)")
    top.legend()
    bottom.set_ylabel("person's share")
    bottom.set_xlabel("wall-clock minute of training")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
