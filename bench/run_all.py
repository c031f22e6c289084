"""Run every benchmark of this folder and write one Markdown report with plots.

Run: ``python bench/run_all.py [--quick] [--out bench/results] [--only NAME ...]`` (``scripts/bench.sh`` does
the setup first). Each benchmark runs in a process of its own (a fresh allocator and GIL, no state
carried from one to the next), prints its tables, and saves its results as JSON; the report
``<out>/report.md`` is rebuilt from those files, with plots beside it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

BENCHMARKS = (
    "codec",
    "observation",
    "action",
    "timing",
    "step_rate",
    "throughput",
    "policy_execution",
    "policy_node",
    "network",
    "gym",  # only with the gym extra installed
)


def run_benchmark(name: str, out: Path, quick: bool) -> Path | None:
    """Run ``bench_<name>.py``; its JSON results file (None for the codec, which prints only)."""
    if name == "gym" and importlib.util.find_spec("gymnasium") is None:
        print("\n=== gym: skipped, the gym extra is not installed (scripts/setup-venv.sh .venv kilted '' gym)")
        return None
    script = common.ROOT / "bench" / f"bench_{name}.py"
    command = [sys.executable, str(script)]
    json_path = out / f"{name}.json"
    if name == "codec":
        command += ["--quick"] if quick else []
    elif name == "gym" and importlib.util.find_spec("ray") is None:
        print("\n=== gym: learning with the demo trainer; RLlib PPO needs the rllib extra too")
        command += ["--trainer", "demo", "--json", str(json_path)] + (["--quick"] if quick else [])
    else:
        command += ["--json", str(json_path)] + (["--quick"] if quick else [])
    print(f"\n=== {name}: {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    completed = subprocess.run(command, check=False, env=common.ros_env(), capture_output=True, text=True)
    sys.stdout.write(completed.stdout)
    if completed.returncode != 0:
        sys.stderr.write(completed.stderr[-5000:])
        raise SystemExit(f"bench_{name}.py failed with status {completed.returncode}")
    print(f"({time.monotonic() - started:.0f} s)", flush=True)
    if name == "codec":
        (out / "codec.md").write_text(completed.stdout)
        return None
    return json_path


def environment_lines() -> list[str]:
    def version(module: str) -> str:
        try:
            from importlib.metadata import version as v

            return v(module)
        except Exception:  # a missing version only makes the report's header shorter
            return "?"

    try:
        commit = subprocess.run(
            ["git", "-C", str(common.ROOT), "describe", "--always", "--dirty"],
            check=False,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        commit = "?"
    import os

    return [
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}; commit {commit or '?'}",
        f"- machine: {os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}; "
        f"Python {platform.python_version()}",
        f"- rclpy {version('ros-rclpy') if version('ros-rclpy') != '?' else version('ros-jazzy-rclpy')}, "
        f"websockets {version('websockets')}, numpy {version('numpy')}, msgpack {version('msgpack')}, "
        f"opencv {version('opencv-python-headless')}, pillow {version('pillow')}",
    ]


# -- plots -------------------------------------------------------------------------


def _pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, ax: Any, path: Path, legend_size: int | None) -> bool:
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_observation(results: dict[str, Any], path: Path) -> bool:
    plt = _pyplot()
    rows = [r for r in results["rows"] if r["payload"] > 0]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for case, marker in (("raw224", "o"), ("raw640", "s"), ("jpeg640", "^")):
        mine = sorted((r for r in rows if r["image"] == case), key=lambda r: r["payload"])
        if mine:
            xs = [r["payload"] / 1e6 for r in mine]
            ax.plot(xs, [r["total"] * 1e3 for r in mine], marker=marker, label=f"{case}: total")
            ax.plot(
                xs,
                [(r["capture"] + r["encode"]) * 1e3 for r in mine],
                marker=marker,
                linestyle="--",
                label=f"{case}: capture+encode",
            )
    floor = sorted(rows, key=lambda r: r["payload"])
    ax.plot([r["payload"] / 1e6 for r in floor], [r["floor"] * 1e3 for r in floor], "k:", label="memcpy floor")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("infer payload per step, MB (n = 1, 4, 16 envs)")
    ax.set_ylabel("ms per step")
    ax.set_title("Observation path: ROS messages → infer frame")
    ax.grid(True, which="both", alpha=0.3)
    return _save(plt, fig, ax, path, legend_size=7)


def plot_timing(results: dict[str, Any], path: Path) -> bool:
    plt = _pyplot()
    rows = [r for r in results["rows"] if r["intervals_ms"]]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        period = 1000.0 / r["rate"]
        deviations = sorted(abs(i - period) for i in r["intervals_ms"])
        n = len(deviations)
        label = f"{r['rate']:g} Hz, {r['camera']}" + ("" if r["reuse"] else ", no reuse")
        ax.plot([max(d, 1e-3) for d in deviations], [1 - (k + 0.5) / n for k in range(n)], label=label)
    ax.axvline(2.0, color="k", linestyle=":", label="2 ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("|interval - period|, ms")
    ax.set_ylabel("fraction of intervals exceeding")
    ax.set_title("Control timing: actuator publication intervals")
    ax.grid(True, which="both", alpha=0.3)
    return _save(plt, fig, ax, path, legend_size=7)


def plot_throughput(results: dict[str, Any], path: Path) -> bool:
    plt = _pyplot()
    rows = [r for r in results["rows"] if r["reuse"]]
    kinds = [k for k in ("baseline", "headless", "bridge") if any(r["kind"] == k for r in rows)]
    counts = sorted({r["n"] for r in rows})
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        values = [next((r["steps_per_s"] for r in rows if r["kind"] == kind and r["n"] == n), 0) for n in counts]
        ax.bar([c + i * width for c in range(len(counts))], values, width, label=kind)
    ax.set_xticks([c + width * (len(kinds) - 1) / 2 for c in range(len(counts))])
    ax.set_xticklabels([f"{n} env(s)" for n in counts])
    ax.set_yscale("log")
    ax.set_ylabel("env steps per second")
    ax.set_title("Lockstep throughput, probe envs")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    return _save(plt, fig, ax, path, legend_size=None)


def plot_network(results: dict[str, Any], path: Path) -> bool:
    rows = [r for r in results["rows"] if r.get("group") == "rtt"]
    if not rows:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, mode in zip(axes, ("lockstep", "timer")):
        for h in sorted({r["horizon"] for r in rows}):
            for reuse in (True, False):
                line = sorted(
                    (r["rtt_ms"], r["rate"]) for r in rows if (r["mode"], r["horizon"], r["reuse"]) == (mode, h, reuse)
                )
                if line:
                    ax.plot(
                        *zip(*line),
                        marker="o",
                        linestyle="-" if reuse else "--",
                        label=f"H={h}, reuse {'on' if reuse else 'off'}",
                    )
        ax.set_title(f"{mode}")
        ax.set_xlabel("round-trip time, ms")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("env steps per second (1 env)")
    axes[1].legend(fontsize=8)
    fig.suptitle("Env-step rate vs round-trip time (probe robot + bridge)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- the report ------------------------------------------------------------------------


def build_report(out: Path, title: str) -> Path:
    import bench_action
    import bench_gym
    import bench_network
    import bench_observation
    import bench_policy_execution
    import bench_policy_node
    import bench_step_rate
    import bench_throughput
    import bench_timing

    sections = [f"# {title}", "", *environment_lines(), ""]
    sections.append(
        "Medians of interleaved repetitions; ratios are against baselines measured in the same run "
        "(absolute times on this shared machine are noisy). See bench/README.md for what each number means."
    )
    targets: list[str] = []
    renderers = (
        ("observation", bench_observation, plot_observation),
        ("action", bench_action, None),
        ("timing", bench_timing, plot_timing),
        ("step_rate", bench_step_rate, None),
        ("throughput", bench_throughput, plot_throughput),
        ("policy_execution", bench_policy_execution, None),
        ("policy_node", bench_policy_node, None),
        ("network", bench_network, plot_network),
        ("gym", bench_gym, bench_gym.plot),
    )
    for name, module, plot in renderers:
        path = out / f"{name}.json"
        if not path.exists():
            continue
        results = json.loads(path.read_text())
        sections += ["", module.tables(results)]
        targets += results.get("verdict", [])
        if plot is not None and plot(results, out / f"{name}.png"):
            sections += ["", f"![{name}]({name}.png)"]
    codec = out / "codec.md"
    if codec.exists():
        sections += [
            "",
            "### Codec alone (bench_codec.py: infer of 2x224x224x3 + 14 states per env)",
            "",
            codec.read_text().strip(),
        ]
    if targets:
        sections += ["", "## Targets", ""] + [f"- {line}" for line in targets]
    report = out / "report.md"
    report.write_text("\n".join(sections) + "\n")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny runs: check that every benchmark works")
    parser.add_argument("--out", default=str(common.ROOT / "bench" / "results"), help="where results go")
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, help="run only these benchmarks")
    parser.add_argument("--report-only", action="store_true", help="rebuild the report from saved results")
    parser.add_argument("--title", default="plugrl_ros benchmark report")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for name in args.only or BENCHMARKS:
            run_benchmark(name, out, args.quick)
    report = build_report(out, args.title)
    print(f"\nreport: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
