"""Gymnasium envs through ROS: does a trainer learn the same, and what does the ROS path cost per env step?

Run: ``python bench/bench_gym.py [--quick] [--trainer demo] [--seeds 3] [--json PATH]`` (needs the gym
extra: ``scripts/setup-venv.sh .venv kilted "" gym``).

Learning equivalence. One trainer (``--trainer``; ``demo`` is the demo's
policy-gradient learner, and :data:`TRAINERS` takes others) learns
``--env`` (InvertedPendulum-v5) from the same seeds two ways:

* direct: the env stepped in-process by the package's headless client
  (``python -m plugrl_ros.gym.direct``), no ROS;
* ros: ``plugrl-gym-robot`` and the bridge (its printed config), lockstep.

Each run ends when the trainer has seen ``--steps`` env steps. Reported: the
return at equal env steps (the mean of the episodes ending in the window
before each mark) as mean ± std over the seeds, whether the two paths gave the
very same episodes (with one copy and a deterministic trainer they must), and
the wall-clock and the client-side CPU (direct process; robot + bridge
processes) per env step of ros over direct, all from this one run.

Throughput. Lockstep env steps/s of Pendulum-v1 (no terminations; its
200-step limit is a multiple of the chunk, so every chunk runs whole) with 1 /
4 / 16 copies against ``bench_trainer.py``: the gym robot + bridge against the
direct client, in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

LEARNING_ENV = "InvertedPendulum-v5"
THROUGHPUT_ENV = "Pendulum-v1"
THROUGHPUT_HORIZON = 4
COPY_COUNTS = (1, 4, 16)
PATHS = ("direct", "ros")
THROUGHPUT_HEAD = (
    "copies", "direct env steps/s", "gym robot + bridge env steps/s", "ROS ÷ direct",
    "direct CPU µs/step", "robot + bridge CPU µs/step",
)  # fmt: skip


# -- trainers ------------------------------------------------------------------------


class LearningTrainer(Protocol):
    """What the learning benchmark runs: a PlugRL trainer serving one run (as :class:`TrainerThread` runs it)
    that lists the episodes it has seen."""

    async def start(self) -> int: ...

    async def finished(self) -> Any: ...

    def end(self) -> None: ...

    def episodes(self) -> list[tuple[int, float, int]]:
        """(env, return, length) of every episode ended so far, in the order they ended."""
        ...


def demo_trainer(seed: int, action_dim: int) -> LearningTrainer:
    """The demo trainer's learner, one decision per step, tuned for InvertedPendulum (it learns in 15k steps)."""
    from plugrl_ros.demo.trainer import DemoTrainer, DemoTrainerSettings

    class Demo(DemoTrainer):
        def episodes(self) -> list[tuple[int, float, int]]:
            return [(r.env, r.ret, r.length) for r in self.records()]

    settings = DemoTrainerSettings(
        port=0, duration_s=3600.0, horizon=1, action_dim=action_dim, seed=seed, gamma=0.9, batch_episodes=8
    )
    return Demo(settings)


# name -> a factory of the trainer for (seed, action_dim)
TRAINERS: dict[str, Callable[[int, int], LearningTrainer]] = {"demo": demo_trainer}


# -- one learning run ------------------------------------------------------------------


@dataclass
class LearningRun:
    path: str
    seed: int
    episodes: list[tuple[int, float, int]]
    steps: int
    wall_per_step: float  # seconds, from the first episode's end to the last step counted
    cpu_per_step: float  # CPU seconds of the client's processes over the same steps


def client_commands(path: str, env_id: str, uri: str, copies: int, seed: int, tmp: Path) -> list[list[str]]:
    """The processes of one path: the direct client, or the gym robot and the bridge with its printed config."""
    import subprocess

    from plugrl_ros import executables

    if path == "direct":
        return [
            executables.command(
                "plugrl_ros.gym.direct", "--env", env_id, "--server", uri, "--copies", str(copies),
                "--seed", str(seed), "--quiet",
            )
        ]  # fmt: skip
    options = ["--env", env_id, "--copies", str(copies)]
    config = tmp / f"gym_{env_id}_{copies}.yaml"
    printed = subprocess.run(
        executables.command("plugrl_ros.gym.robot_node", *options, "--print-config"),
        env=common.ros_env(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    config.write_text(printed.stdout)
    robot = executables.command("plugrl_ros.gym.robot_node", *options, "--seed", str(seed))
    bridge = common.bridge_command(
        None, "--ros-args", "--params-file", str(config), "-p", f"trainer.uri:={uri}",
        "-p", "status.log_period_s:=0.0", "--log-level", "warn",
    )  # fmt: skip
    return [robot, bridge]


def learning_run(trainer_name: str, path: str, seed: int, steps: int, tmp: Path) -> LearningRun:
    from plugrl_ros.gym.copies import GymCopy
    from plugrl_ros.tools.serving import TrainerThread

    width = GymCopy(LEARNING_ENV, 0, seed).action.width
    trainer = TRAINERS[trainer_name](seed, width)
    thread = TrainerThread(trainer, name=f"bench-gym-{trainer_name}")
    port = thread.start()
    with common.children() as started:
        for command in client_commands(path, LEARNING_ENV, f"ws://127.0.0.1:{port}", 1, seed, tmp):
            started.append(common.Child(command))
        common.wait_for(lambda: bool(trainer.episodes()), 120, f"the {path} client's first episode")
        meters = [common.ProcessMeter(child.pid) for child in started]
        for meter in meters:
            meter.start()
        first = sum(length for _, _, length in trainer.episodes())
        began = time.monotonic()
        common.wait_for(lambda: sum(e[2] for e in trainer.episodes()) >= steps, 3600, f"{steps} env steps")
        wall = time.monotonic() - began
        cpu = sum(meter.stop()["cpu_percent"] for meter in meters) / 100 * wall
        for child in started:
            if not child.alive():
                raise RuntimeError(f"a {path} process exited:\n{child.output()[-3000:]}")
    thread.end()
    thread.result(60)
    episodes = trainer.episodes()
    measured = sum(e[2] for e in episodes) - first
    return LearningRun(path, seed, episodes, sum(e[2] for e in episodes), wall / measured, cpu / measured)


def returns_at(episodes: list[tuple[int, float, int]], marks: list[int], window: int) -> list[float]:
    """At each mark of env steps, the mean return of the episodes that ended in the ``window`` steps before it
    (the last episode ended before it, if none did)."""
    ends, total = [], 0
    for _, ret, length in episodes:
        total += length
        ends.append((total, ret))
    out = []
    for mark in marks:
        inside = [ret for end, ret in ends if mark - window < end <= mark]
        before = [ret for end, ret in ends if end <= mark]
        out.append(statistics.fmean(inside) if inside else before[-1] if before else float("nan"))
    return out


def identical_prefix(a: list[tuple[int, float, int]], b: list[tuple[int, float, int]]) -> tuple[bool, int]:
    n = min(len(a), len(b))
    return a[:n] == b[:n], n


# -- throughput ---------------------------------------------------------------------


def throughput_run(path: str, copies: int, seconds: float, warmup: float, tmp: Path) -> dict[str, Any]:
    with common.children() as started:
        trainer = common.TrainerChild("--horizon", str(THROUGHPUT_HORIZON), "--action-dim", "1", "--reuse")
        started.append(trainer)
        clients = [common.Child(c) for c in client_commands(path, THROUGHPUT_ENV, trainer.uri, copies, 0, tmp)]
        started.extend(clients)
        common.wait_for(lambda: trainer.stats()["steps"] > 2 * copies, 90, f"the {path} client's first steps")
        time.sleep(warmup)
        meters = [common.ProcessMeter(c.pid) for c in clients]
        for meter in meters:
            meter.start()
        before = trainer.stats()
        time.sleep(seconds)
        after = trainer.stats()
        cpu_percent = sum(meter.stop()["cpu_percent"] for meter in meters)
        for client in clients:
            if not client.alive():
                raise RuntimeError(f"the {path} client exited:\n{client.output()[-3000:]}")
    wire = common.difference(after, before)
    rate = wire["steps"] / wire["t"]
    return {"path": path, "copies": copies, "steps_per_s": rate, "cpu_us_per_step": cpu_percent / 100 / rate * 1e6}


# -- tables and plot ------------------------------------------------------------------


def tables(results: dict[str, Any]) -> str:
    learning = results["learning"]
    seeds = learning["seeds"]
    lines = [
        f"### Gymnasium through ROS: learning equivalence ({learning['env']}, trainer `{learning['trainer']}`, "
        f"{len(seeds)} seeds, 1 copy, {learning['steps']:,} env steps per run)",
        "",
    ]
    head = ("env steps", "direct: return (mean ± std)", "through ROS: return (mean ± std)")
    body = []
    for i, mark in enumerate(learning["marks"]):
        cells = []
        for path in PATHS:
            values = [curve[i] for curve in learning["returns"][path]]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.fmean(values):.1f} ± {spread:.1f}")
        body.append((f"{mark:,}", *cells))
    lines.append(common.md_table(head, body))
    same = learning["identical"]
    lines += [
        "",
        f"Same episodes, return for return, on both paths: {sum(s for s, _ in same)} of {len(same)} seeds "
        f"({', '.join(str(n) for _, n in same)} episodes compared).",
        "",
        common.md_table(
            ("per env step", "direct", "through ROS", "ROS ÷ direct"),
            [
                (
                    what,
                    f"{learning[key]['direct'] * 1e6:,.0f} µs",
                    f"{learning[key]['ros'] * 1e6:,.0f} µs",
                    common.fmt_ratio(learning[key]["ros"] / learning[key]["direct"]),
                )
                for what, key in (("wall-clock", "wall_per_step"), ("client CPU", "cpu_per_step"))
            ],
        ),
    ]
    rows = results["rows"]
    by = {(r["path"], r["copies"]): r for r in rows}
    body = []
    for copies in sorted({r["copies"] for r in rows}):
        direct, ros = by.get(("direct", copies)), by.get(("ros", copies))
        if direct is None or ros is None:
            continue
        body.append(
            (
                copies,
                f"{direct['steps_per_s']:,.0f}",
                f"{ros['steps_per_s']:,.0f}",
                common.fmt_ratio(ros["steps_per_s"] / direct["steps_per_s"]),
                common.fmt_us(direct["cpu_us_per_step"] * 1e-6),
                common.fmt_us(ros["cpu_us_per_step"] * 1e-6),
            )
        )
    lines += [
        "",
        f"### Gymnasium through ROS: lockstep throughput ({THROUGHPUT_ENV}, chunks of {THROUGHPUT_HORIZON})",
        "",
        common.md_table(THROUGHPUT_HEAD, body),
    ]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    learning = results["learning"]
    marks = np.asarray(learning["marks"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, style, width in (("direct", "-", 3.0), ("ros", "--", 1.5)):
        curves = np.asarray(learning["returns"][name])
        mean, std = curves.mean(axis=0), curves.std(axis=0, ddof=1 if len(curves) > 1 else 0)
        label = "direct (in-process client)" if name == "direct" else "through plugrl-gym-robot + bridge"
        line = ax.plot(marks, mean, style, linewidth=width, label=f"{label}: mean ± std of {len(curves)} seeds")[0]
        ax.fill_between(marks, mean - std, mean + std, alpha=0.12, color=line.get_color())
        for curve in curves:
            ax.plot(marks, curve, style, linewidth=0.6, alpha=0.5, color=line.get_color())
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return (episodes ending in the last tenth)")
    ax.set_title(f"{learning['env']}, trainer '{learning['trainer']}', same seeds on both paths")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- main -------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_arguments(parser, repeat=1)
    parser.add_argument("--trainer", choices=sorted(TRAINERS), default="demo")
    parser.add_argument("--seeds", type=int, default=3, help="learning runs per path (default %(default)s)")
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per learning run")
    parser.add_argument("--seconds", type=float, default=8.0, help="throughput window per case")
    parser.add_argument("--plot", default="", help="also draw the learning curves into this PNG")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps, args.seconds = 1, 600, 2.0
    common.use_own_domain()
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="bench-gym-"))
    runs = {path: [] for path in PATHS}
    for seed in range(args.seeds):
        for path in PATHS:  # interleaved: load on the shared cores hits both paths alike
            run = learning_run(args.trainer, path, seed, args.steps, tmp)
            runs[path].append(run)
            print(f"seed {seed} {path}: {len(run.episodes)} episodes, {run.steps} steps", flush=True)
    window = max(args.steps // 10, 1)
    marks = [window * k for k in range(1, 11)]
    learning = {
        "env": LEARNING_ENV,
        "trainer": args.trainer,
        "seeds": list(range(args.seeds)),
        "steps": args.steps,
        "marks": marks,
        "returns": {path: [returns_at(r.episodes, marks, window) for r in runs[path]] for path in PATHS},
        "identical": [identical_prefix(a.episodes, b.episodes) for a, b in zip(runs["direct"], runs["ros"])],
        "wall_per_step": {path: statistics.median(r.wall_per_step for r in runs[path]) for path in PATHS},
        "cpu_per_step": {path: statistics.median(r.cpu_per_step for r in runs[path]) for path in PATHS},
    }
    rows = []
    for copies in COPY_COUNTS[:1] if args.quick else COPY_COUNTS:
        for path in PATHS:
            rows.append(throughput_run(path, copies, args.seconds, 1.0 if args.quick else 3.0, tmp))
    results = {"learning": learning, "rows": rows}
    print(tables(results))
    if args.plot:
        plot(results, Path(args.plot))
    common.save_json(args.json, "gym", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
