"""Gymnasium envs through ROS: does a trainer learn the same, and what does the ROS path cost per env step?

Run: ``python bench/bench_gym.py [--quick] [--trainer rllib|demo ...] [--seeds 3] [--part all|learning|throughput]
[--json PATH] [--plot PNG]`` (needs the gym extra, and for the default trainer the rllib extra too:
``scripts/setup-venv.sh .venv kilted "" gym,rllib``; ``OMP_NUM_THREADS=1`` on a small machine).

Learning equivalence. One trainer learns InvertedPendulum-v5 from the same
seeds two ways:

* direct: the env stepped in-process by the package's headless client
  (``python -m plugrl_ros.gym.direct``), no ROS;
* ros: ``plugrl-gym-robot`` and the bridge (its printed config), lockstep;

and, for the rllib trainer, the baseline an RLlib user would pick instead:

* own: the same PPO config, seed, RLModule and connectors with RLlib's own
  ``SingleAgentEnvRunner`` stepping the env in its process (no PlugRL, no
  ROS; ``bench_rllib.py``'s driver).

The trainer (``--trainer``, :data:`TRAINERS`; given twice, both in one run):
``rllib`` (the default) is RLlib PPO with a
:class:`~plugrl_ros.rllib.env_runner.PlugRLEnvRunner` serving whichever
path connects, its spaces read from the bridge config the ROS path runs
with (:func:`ppo_config`); ``demo`` is the demo's policy-gradient learner.
Each run ends when the trainer has seen the trainer's number of env steps
(``--steps`` overrides). Reported: the return at equal env steps (the mean of
the episodes ending in the window before each mark) as mean ± std over the
seeds, whether the two paths gave the very same episodes, and the wall-clock
(with and without the trainer's updates, during which RLlib's robots wait)
and the client-side CPU (direct process; robot + bridge processes) per env
step of ros over RLlib's own runner (over direct for the demo trainer), all
from this one run. Each process's CPU per env step against RLlib's own runner,
at 1 and 8 copies, is ``bench_rllib.py``'s cost part.

Throughput. Lockstep env steps/s of Pendulum-v1 (no terminations; its
200-step limit is a multiple of the chunk, so every chunk runs whole) with 1 /
4 / 16 copies against ``bench_trainer.py``: the gym robot + bridge against the
direct client, in the same run.
"""

from __future__ import annotations

import argparse
import importlib.util
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
OWN = "own"  # RLlib's own SingleAgentEnvRunner (the rllib trainer only): the baseline
# the throughput part adds the ROS floor: the gym robot stepped by a bare rclpy node (no trainer, no bridge)
THROUGHPUT_PATHS = ("direct", "ros-floor", "ros")
THROUGHPUT_HEAD = (
    "copies", "direct env steps/s", "ROS floor env steps/s", "gym robot + bridge env steps/s", "ROS ÷ direct",
    "bridge ÷ ROS floor", "direct CPU µs/step", "robot + floor CPU µs/step", "robot + bridge CPU µs/step",
)  # fmt: skip


# -- trainers ------------------------------------------------------------------------


@dataclass(frozen=True)
class LearningTask:
    """What a trainer is built for: the env, the seed, and the bridge config both paths share."""

    env_id: str
    seed: int
    params_file: Path  # what plugrl-gym-robot --print-config printed: the ROS path's bridge runs with it
    state_dims: dict[str, int]  # the observation's states and their widths
    action_dim: int


class LearningTrainer(Protocol):
    """What the learning benchmark runs: a PlugRL trainer serving one run (as :class:`TrainerThread` runs it)
    that lists the episodes it has seen."""

    async def start(self) -> int: ...

    async def finished(self) -> Any: ...

    def end(self) -> None: ...

    def episodes(self) -> list[tuple[int, float, int]]:
        """(env, return, length) of every episode ended so far, in the order they ended."""
        ...

    def serving_intervals(self) -> list[tuple[float, float]]:
        """(start, end) monotonic times in which the trainer answered the robots (empty: always)."""
        ...


def demo_trainer(task: LearningTask) -> LearningTrainer:
    """The demo trainer's learner, one decision per step, tuned for InvertedPendulum (it learns in 15k steps)."""
    from plugrl_ros.demo.trainer import DemoTrainer, DemoTrainerSettings

    class Demo(DemoTrainer):
        def episodes(self) -> list[tuple[int, float, int]]:
            return [(r.env, r.ret, r.length) for r in self.records()]

        def serving_intervals(self) -> list[tuple[float, float]]:
            return []  # it updates between two answers, in the time it answers

    settings = DemoTrainerSettings(
        port=0,
        duration_s=3600.0,
        horizon=1,
        action_dim=task.action_dim,
        seed=task.seed,
        gamma=0.9,
        batch_episodes=8,
    )
    return Demo(settings)


# RLlib PPO for InvertedPendulum-v5, one decision per control step (H = 1). Tuned on this 2-core machine
# (RLlib's own runner, 40k steps, seeds 0-2): a discount of 0.9 per step (the pole falls within a few steps
# of a bad action; 0.99 had not learned by 50k) and no KL penalty (clipping alone; with it, 1,000 came
# later or not at all) reach the full 1,000 steps by about 20k-25k env steps.
PPO_HORIZON = 1
PPO_SETTINGS: dict[str, Any] = {
    "gamma": 0.9,
    "lambda_": 0.95,
    "lr": 2e-3,
    "use_kl_loss": False,
    "train_batch_size_per_learner": 1000,
    "minibatch_size": 250,
    "num_epochs": 15,
    # RLlib clips each squared value error at this; values reach 10 (1 per step, discounted by 0.9), so its
    # default of 10 would drop the large early errors' gradients: effectively unclipped
    "vf_clip_param": 1000.0,
}
PPO_HIDDEN = [32, 32]
SAMPLE_WAIT_S = 300.0


def ppo_config(task: LearningTask, serving_runner: type) -> Any:
    """RLlib PPO with a PlugRL runner as its only EnvRunner, the spaces read from the bridge config."""
    from plugrl_ros.rllib import RunnerSettings, chunk_gamma, robot_spaces
    from plugrl_ros.rllib.demo import local_ppo

    spaces = robot_spaces(task.params_file, horizon=PPO_HORIZON, state_dims=task.state_dims)
    # Every sample() waits for its whole batch (sample_wait_s, far above the ~10 s a batch takes through ROS on
    # a busy machine): a sample cut short by its wait makes RLlib sample again and train on a larger batch, so
    # the updates, and all that follows, would depend on how fast the path steps.
    runner = RunnerSettings(host="127.0.0.1", port=0, horizon=PPO_HORIZON, sample_wait_s=SAMPLE_WAIT_S)
    training = {**PPO_SETTINGS, "gamma": chunk_gamma(PPO_SETTINGS["gamma"], PPO_HORIZON)}
    return local_ppo(
        spaces, runner, training=training, hidden=PPO_HIDDEN, seed=task.seed, sample_timeout_s=2 * SAMPLE_WAIT_S,
        runner_cls=serving_runner,
    )  # fmt: skip


def rllib_trainer(task: LearningTask) -> LearningTrainer:
    """RLlib PPO (:func:`ppo_config`) whose PlugRL runner serves whichever path connects: the direct client or
    the bridge. The runner only adds a record of when ``sample()`` ran (the robots are answered only then)."""
    import time as _time

    from plugrl_ros.rllib import PlugRLEnvRunner
    from plugrl_ros.rllib.demo import RLlibDemoTrainer

    class TimedRunner(PlugRLEnvRunner):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.sampled: list[tuple[float, float]] = []

        def sample(self, **kwargs: Any) -> Any:
            started = _time.monotonic()
            try:
                return super().sample(**kwargs)
            finally:
                self.sampled.append((started, _time.monotonic()))

    class PPO(RLlibDemoTrainer):
        def episodes(self) -> list[tuple[int, float, int]]:
            return [(r.env, r.ret, r.length) for r in self.records()]

        def serving_intervals(self) -> list[tuple[float, float]]:
            return [] if self.runner is None else list(self.runner.sampled)

    return PPO(lambda: ppo_config(task, TimedRunner), duration_s=24 * 3600.0)


# name -> a factory of the trainer for a task
TRAINERS: dict[str, Callable[[LearningTask], LearningTrainer]] = {"rllib": rllib_trainer, "demo": demo_trainer}
# env steps per learning run: what each trainer needs to learn the task
TRAINER_STEPS = {"rllib": 40_000, "demo": 20_000}
QUICK_STEPS = 1_200  # --quick: enough for one PPO update (train_batch_size_per_learner) in the run


# -- one learning run ------------------------------------------------------------------


@dataclass
class LearningRun:
    path: str
    seed: int
    episodes: list[tuple[int, float, int]]
    steps: int
    wall_per_step: float  # seconds, from the first episode's end to the last step counted
    serving_wall_per_step: float  # the same, counting only the time the trainer answered (its updates left out)
    cpu_per_step: float  # CPU seconds of the client's processes over the same steps


def bridge_config(env_id: str, copies: int, tmp: Path) -> Path:
    """The bridge config ``plugrl-gym-robot --print-config`` prints for the env, written to a file."""
    import subprocess

    from plugrl_ros import executables

    config = tmp / f"gym_{env_id}_{copies}.yaml"
    if not config.exists():
        printed = subprocess.run(
            executables.command("plugrl_ros.gym.robot_node", "--env", env_id, "--copies", str(copies),
                                "--print-config"),
            env=common.ros_env(), capture_output=True, text=True, check=True,
        )  # fmt: skip
        config.write_text(printed.stdout)
    return config


def client_commands(path: str, env_id: str, uri: str, copies: int, seed: int, tmp: Path) -> list[list[str]]:
    """The processes of one path: the direct client, or the gym robot and the bridge with its printed config."""
    from plugrl_ros import executables

    if path == "direct":
        return [
            executables.command(
                "plugrl_ros.gym.direct", "--env", env_id, "--server", uri, "--copies", str(copies),
                "--seed", str(seed), "--quiet",
            )
        ]  # fmt: skip
    robot = executables.command(
        "plugrl_ros.gym.robot_node", "--env", env_id, "--copies", str(copies), "--seed", str(seed)
    )
    if path == "ros-floor":  # on the bridge's executor
        return [robot, common.python_script("ros_lockstep_client.py", "--robot", "gym", "--envs", str(copies),
                                            "--executor", "events")]  # fmt: skip
    bridge = common.bridge_command(
        None, "--ros-args", "--params-file", str(bridge_config(env_id, copies, tmp)), "-p", f"trainer.uri:={uri}",
        "-p", "status.log_period_s:=0.0", "--log-level", "warn",
    )  # fmt: skip
    return [robot, bridge]


def learning_task(env_id: str, seed: int, tmp: Path) -> LearningTask:
    from plugrl_ros.gym.copies import GymCopy

    copy = GymCopy(env_id, 0, seed)
    try:
        dims = {key.name: key.size for key in copy.keys}
        return LearningTask(env_id, seed, bridge_config(env_id, 1, tmp), dims, copy.action.width)
    finally:
        copy.close()


def overlap(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` inside the intervals (which do not overlap one another)."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


def learning_run(trainer_name: str, path: str, seed: int, steps: int, tmp: Path) -> LearningRun:
    from plugrl_ros.tools.serving import TrainerThread

    trainer = TRAINERS[trainer_name](learning_task(LEARNING_ENV, seed, tmp))
    thread = TrainerThread(trainer, name=f"bench-gym-{trainer_name}")
    port = thread.start(300)  # RLlib's algorithm is built first: Ray, torch, the module

    def steps_seen() -> int:
        if not thread.alive:  # the trainer's run is over before the benchmark ended it: say why
            thread.result(0)
            raise RuntimeError(f"the {trainer_name} trainer's run ended by itself")
        return sum(length for _, _, length in trainer.episodes())

    with common.children() as started:
        for command in client_commands(path, LEARNING_ENV, f"ws://127.0.0.1:{port}", 1, seed, tmp):
            started.append(common.Child(command))
        common.wait_for(lambda: steps_seen() > 0, 120, f"the {path} client's first episode")
        meters = [common.ProcessMeter(child.pid) for child in started]
        for meter in meters:
            meter.start()
        first = steps_seen()
        began = time.monotonic()
        common.wait_for(lambda: steps_seen() >= steps, 7200, f"{steps} env steps")
        ended = time.monotonic()
        last = steps_seen()
        cpu = sum(meter.stop()["cpu_percent"] for meter in meters) / 100 * (ended - began)
        for child in started:
            if not child.alive():
                raise RuntimeError(f"a {path} process exited:\n{child.output()[-3000:]}")
        steps_seen()
        thread.end()  # the trainer ends the run (plugrl-server-stop) while the clients are still connected
        thread.result(120)
    episodes = trainer.episodes()
    measured = last - first
    wall = ended - began
    serving = trainer.serving_intervals()
    served = overlap(serving, began, ended) if serving else wall
    return LearningRun(
        path, seed, episodes, sum(e[2] for e in episodes), wall / measured, served / measured, cpu / measured
    )


def own_run(seed: int, steps: int, tmp: Path) -> LearningRun:
    """The same PPO (:func:`ppo_config`'s settings, seed, module and connectors) with RLlib's own
    ``SingleAgentEnvRunner`` stepping the env in its process (``bench_rllib.py``'s driver): the baseline."""
    import bench_rllib

    run = bench_rllib.run("ppo", "own", LEARNING_ENV, 1, seed, steps, tmp)
    figures = bench_rllib.per_step(run, skip_steps=min(PPO_SETTINGS["train_batch_size_per_learner"], steps // 2))
    episodes = [(0, ret, length) for _, ret, length in run.episodes]
    return LearningRun(
        OWN, seed, episodes, sum(e[2] for e in episodes), figures["wall"], figures["sample_wall"], float("nan")
    )


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


def first_difference(a: list[tuple[int, float, int]], b: list[tuple[int, float, int]]) -> tuple[int | None, int]:
    """The index of the first episode in which two runs differ (None: none of the compared ones), and how many
    episodes were compared (those both runs finished)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), None), n


# -- throughput ---------------------------------------------------------------------


def throughput_run(path: str, copies: int, seconds: float, warmup: float, tmp: Path) -> dict[str, Any]:
    with common.children() as started:
        trainer = common.TrainerChild("--horizon", str(THROUGHPUT_HORIZON), "--action-dim", "1", "--reuse")
        started.append(trainer)
        clients = [common.Child(c) for c in client_commands(path, THROUGHPUT_ENV, trainer.uri, copies, 0, tmp)]
        started.extend(clients)
        # the ROS floor has no trainer: its client counts its own steps
        counter = (lambda: common.last_json_line(clients[-1])) if path == "ros-floor" else trainer.stats
        wire, processes = common.measure_steps(counter, clients, 2 * copies, seconds, warmup, path)
    cpu_percent = sum(p["cpu_percent"] for p in processes)
    rate = wire["steps"] / wire["t"]
    return {"path": path, "copies": copies, "steps_per_s": rate, "cpu_us_per_step": cpu_percent / 100 / rate * 1e6}


# -- tables and plot ------------------------------------------------------------------


def learning_sections(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The learning results, one per trainer (a results file of one trainer holds a single map)."""
    learning = results["learning"]
    return [learning] if isinstance(learning, dict) else list(learning)


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.1f} ± {spread:.1f}"


def learning_table(learning: dict[str, Any]) -> str:
    seeds = learning["seeds"]
    returns = learning["returns"]
    own = OWN in returns  # results saved before RLlib's own runner was measured have no such path
    lines = [
        f"### Gymnasium through ROS: learning equivalence ({learning['env']}, trainer `{learning['trainer']}`, "
        f"{len(seeds)} seeds, 1 copy, {learning['steps']:,} env steps per run)",
        "",
    ]
    head = ("env steps", "direct: return (mean ± std)", "through ROS: return (mean ± std)", "ROS - direct")
    if own:
        head += ("RLlib's own runner: return (mean ± std)", "ROS - RLlib's own")
    body = []
    for i, mark in enumerate(learning["marks"]):
        values = {path: [curve[i] for curve in returns[path]] for path in returns}
        row = [f"{mark:,}", mean_std(values["direct"]), mean_std(values["ros"]), _gap(values, "direct")]
        if own:
            row += [mean_std(values[OWN]), _gap(values, OWN)]
        body.append(row)
    # each run's curve in one number: its mean over the marks (the area under it)
    whole = {path: [statistics.fmean(curve) for curve in returns[path]] for path in returns}
    row = ["mean over the marks", mean_std(whole["direct"]), mean_std(whole["ros"]), _gap(whole, "direct")]
    if own:
        row += [mean_std(whole[OWN]), _gap(whole, OWN)]
    body.append(row)
    lines.append(common.md_table(head, body))
    differences = learning["first_difference"]
    same = sum(first is None for first, _ in differences)
    diverged = [
        f"seed {seed}: episode {first + 1} of {n}" for seed, (first, n) in zip(seeds, differences) if first is not None
    ]
    lines += [
        "",
        f"Same episodes, return for return, on both paths: {same} of {len(differences)} seeds "
        f"({', '.join(str(n) for _, n in differences)} episodes compared)"
        + (f"; the first that differs: {', '.join(diverged)}." if diverged else "."),
        "",
    ]
    # the baseline is what a user would pick instead: RLlib's own runner where it ran, else the direct client
    base, title = (OWN, "RLlib's own runner") if own else ("direct", "direct")
    per_step_paths = [base, *(path for path in PATHS if path != base)]
    head = ("per env step (median of the runs)", *(PER_STEP_TITLES[p] for p in per_step_paths), f"ROS ÷ {title}")
    rows = []
    for what, key in (
        ("wall-clock, the trainer's updates included", "wall_per_step"),
        ("wall-clock while the trainer answers (RLlib's own: while it samples)", "serving_wall_per_step"),
        ("client CPU (direct client; robot + bridge)", "cpu_per_step"),
    ):
        if key not in learning:
            continue
        figures = learning[key]
        cells = [common.fmt_us(figures[p]) + " µs" if figures[p] == figures[p] else "-" for p in per_step_paths]
        ratio = figures["ros"] / figures[base] if figures[base] == figures[base] else float("nan")
        rows.append((what, *cells, common.fmt_ratio(ratio)))
    lines.append(common.md_table(head, rows))
    if own:
        lines += [
            "",
            "RLlib's own runner steps the env in its own process: its CPU, and each process's through ROS, is in "
            "bench_rllib.py's cost table.",
        ]
    return "\n".join(lines)


PER_STEP_TITLES = {OWN: "RLlib's own runner (baseline)", "direct": "direct (in-process client)", "ros": "through ROS"}


def _gap(values: dict[str, list[float]], base: str) -> str:
    return f"{statistics.fmean(values['ros']) - statistics.fmean(values[base]):+.1f}"


def tables(results: dict[str, Any]) -> str:
    lines = []
    for learning in learning_sections(results):
        lines += [learning_table(learning), ""]
    rows = results["rows"]
    if not rows:
        return "\n".join(lines).rstrip()
    by = {(r["path"], r["copies"]): r for r in rows}
    body = []
    for copies in sorted({r["copies"] for r in rows}):
        direct, ros = by.get(("direct", copies)), by.get(("ros", copies))
        if direct is None or ros is None:
            continue
        floor = by.get(("ros-floor", copies))  # absent from results saved before the floor was measured
        body.append(
            (
                copies,
                f"{direct['steps_per_s']:,.0f}",
                f"{floor['steps_per_s']:,.0f}" if floor else "-",
                f"{ros['steps_per_s']:,.0f}",
                common.fmt_ratio(ros["steps_per_s"] / direct["steps_per_s"]),
                common.fmt_ratio(ros["steps_per_s"] / floor["steps_per_s"]) if floor else "-",
                common.fmt_us(direct["cpu_us_per_step"] * 1e-6),
                common.fmt_us(floor["cpu_us_per_step"] * 1e-6) if floor else "-",
                common.fmt_us(ros["cpu_us_per_step"] * 1e-6),
            )
        )
    lines += [
        f"### Gymnasium through ROS: lockstep throughput ({THROUGHPUT_ENV}, chunks of {THROUGHPUT_HORIZON})",
        "",
        common.md_table(THROUGHPUT_HEAD, body),
    ]
    return "\n".join(lines)


TRAINER_TITLES = {"rllib": "RLlib PPO", "demo": "the demo trainer"}
PLOT_LABELS = {
    OWN: "RLlib's own SingleAgentEnvRunner (no ROS)",
    "direct": "(a) direct (in-process client)",
    "ros": "(b) through plugrl-gym-robot + bridge",
}


def plot(results: dict[str, Any], path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    sections = learning_sections(results)
    if not sections:
        return False
    fig, axes = plt.subplots(1, len(sections), figsize=(7 * len(sections), 4.5), squeeze=False)
    for ax, learning in zip(axes[0], sections):
        marks = np.asarray(learning["marks"])
        for name, style, width in ((OWN, ":", 2.0), ("direct", "-", 3.0), ("ros", "--", 1.5)):
            if name not in learning["returns"]:
                continue
            curves = np.asarray(learning["returns"][name])
            mean, std = curves.mean(axis=0), curves.std(axis=0, ddof=1 if len(curves) > 1 else 0)
            label = PLOT_LABELS[name]
            line = ax.plot(marks, mean, style, linewidth=width, label=f"{label}: mean ± std, {len(curves)} seeds")[0]
            ax.fill_between(marks, mean - std, mean + std, alpha=0.12, color=line.get_color())
            for curve in curves:
                ax.plot(marks, curve, style, linewidth=0.6, alpha=0.5, color=line.get_color())
        highest = max(max(max(curve) for curve in curves) for curves in learning["returns"].values())
        ax.set_ylim(0.0, 1.1 * highest)  # the band of mean ± std may pass the highest return a seed reached
        ax.set_xlabel("env steps")
        ax.set_ylabel("episode return (episodes ending in the last tenth)")
        trainer = TRAINER_TITLES.get(learning["trainer"], learning["trainer"])
        ax.set_title(f"{learning['env']}, {trainer}, same seeds on both paths")
        differences = learning["first_difference"]
        same = sum(first is None for first, _ in differences)
        ax.text(
            0.98, 0.03, f"the very same episodes on both paths: {same} of {len(differences)} seeds",
            transform=ax.transAxes, ha="right", va="bottom", fontsize=9,
        )  # fmt: skip
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- main -------------------------------------------------------------------------------


def learn(trainer: str, seeds: int, steps: int, tmp: Path) -> dict[str, Any]:
    """The learning-equivalence runs of one trainer, both paths, interleaved seed by seed."""
    # RLlib's own runner is the baseline an RLlib user would pick instead: it runs for the rllib trainer
    paths = (OWN, *PATHS) if trainer == "rllib" else PATHS
    runs: dict[str, list[LearningRun]] = {path: [] for path in paths}
    for seed in range(seeds):
        for path in paths:  # interleaved: load on the shared cores hits every path alike
            run = own_run(seed, steps, tmp) if path == OWN else learning_run(trainer, path, seed, steps, tmp)
            runs[path].append(run)
            print(f"{trainer}, seed {seed}, {path}: {len(run.episodes)} episodes, {run.steps} steps", flush=True)
    window = max(steps // 10, 1)
    marks = [window * k for k in range(1, 11)]

    def median(key: str) -> dict[str, float]:
        return {path: statistics.median(getattr(r, key) for r in runs[path]) for path in paths}

    return {
        "env": LEARNING_ENV,
        "trainer": trainer,
        "seeds": list(range(seeds)),
        "steps": steps,
        "marks": marks,
        "returns": {path: [returns_at(r.episodes, marks, window) for r in runs[path]] for path in paths},
        "first_difference": [first_difference(a.episodes, b.episodes) for a, b in zip(runs["direct"], runs["ros"])],
        "wall_per_step": median("wall_per_step"),
        "serving_wall_per_step": median("serving_wall_per_step"),
        "cpu_per_step": median("cpu_per_step"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_arguments(parser, repeat=1)
    parser.add_argument(
        "--trainer",
        action="append",
        choices=sorted(TRAINERS),
        help="the learning part's trainer; given twice, both in one run (default: rllib)",
    )
    parser.add_argument("--seeds", type=int, default=3, help="learning runs per path (default %(default)s)")
    parser.add_argument("--steps", type=int, default=0, help="env steps per learning run (default: the trainer's)")
    parser.add_argument("--seconds", type=float, default=8.0, help="throughput window per case")
    parser.add_argument("--part", choices=("all", "learning", "throughput"), default="all", help="what to run")
    parser.add_argument("--plot", default="", help="also draw the learning curves into this PNG")
    args = parser.parse_args()
    trainers = list(dict.fromkeys(args.trainer or ["rllib"]))
    if args.quick:
        args.seeds, args.steps, args.seconds = 1, QUICK_STEPS, 2.0
    if args.part != "throughput" and "rllib" in trainers and importlib.util.find_spec("ray") is None:
        parser.error(
            "the rllib trainer needs the rllib extra (scripts/setup-venv.sh .venv kilted '' gym,rllib); "
            "--trainer demo runs without it"
        )
    common.use_own_domain()
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="bench-gym-"))
    learning = []
    if args.part != "throughput":
        for trainer in trainers:
            learning.append(learn(trainer, args.seeds, args.steps or TRAINER_STEPS[trainer], tmp))
    rows = []
    if args.part != "learning":
        for copies in COPY_COUNTS[:1] if args.quick else COPY_COUNTS:
            for path in THROUGHPUT_PATHS:
                rows.append(throughput_run(path, copies, args.seconds, 1.0 if args.quick else 3.0, tmp))
    results = {"learning": learning, "rows": rows}
    print(tables(results))
    if args.plot and learning:
        plot(results, Path(args.plot))
    common.save_json(args.json, "gym", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
