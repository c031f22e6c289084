"""RLlib through ROS against RLlib's own runner: what an env step costs, and whether SAC learns the same.

Run: ``python bench/bench_rllib.py [--quick] [--part cost|sac|sac-timer|all] [--seeds N] [--steps N]
[--json PATH] [--plot PNG]`` (needs the gym and rllib extras: ``scripts/setup-venv.sh .venv kilted ""
gym,rllib``; ``OMP_NUM_THREADS=1`` on a small machine).

Every run is one RLlib algorithm in a process of its own (``rllib_driver.py``),
with one of two EnvRunners on the same env, config, seed and RLModule:

* ``own`` (the baseline): RLlib's own ``SingleAgentEnvRunner`` stepping the
  Gymnasium env in its process, as an RLlib user would run it (N copies: a
  vector env, batched inference; for SAC, RLlib's tuned example as it is);
* ``ros``: ``plugrl-gym-robot`` (N copies) and the bridge with the config
  the robot prints, served by a ``PlugRLEnvRunner`` (N robots on one bridge:
  batched inference).

Parts:

* ``cost``: RLlib PPO on InvertedPendulum-v5 (H = 1, lockstep, bench_gym.py's
  settings) at 1 and 8 copies: wall-clock per env step (the learner's updates
  included, and while sampling only) and CPU per env step of each process:
  the driver (runner and learner; its CPU inside ``sample()`` is the runner's),
  the robot and the bridge. The first iteration (Ray and torch warming up) is
  left out.
* ``sac``: RLlib's tuned Pendulum SAC (``ray/rllib/tuned_examples/sac/
  pendulum_sac.py``) on Pendulum-v1, 1 copy, lockstep, H = 1: the return at
  5k / 10k / 20k env steps and at the run's end (the mean of the episodes
  ending in the 1,000 steps before each mark), mean ± std over the seeds, own
  vs. ros; and each run's env steps until the mean of its last 5 episodes
  first reached -250 (the example's own pass mark, within 20k steps). The
  baseline is the example itself: ``gymnasium.make("Pendulum-v1")`` in RLlib's
  ``SingleAgentEnvRunner``.
* ``sac-timer``: the same SAC with the robot in timer mode at 50 Hz (stepping
  in real time, as hardware does) and ``serve_during_updates``: the return
  against wall-clock minutes, and the robot's idle share (control ticks
  without a step: 1 - H x RL steps ÷ (50 Hz x time)); ``--timer-horizon H``
  runs it with chunks of H control steps (one RL step, one decision each).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

COST_ENV = "InvertedPendulum-v5"
COST_COPIES = (1, 8)
COST_STEPS = 6_000  # six PPO iterations of 1,000 steps; the first is left out
SAC_ENV = "Pendulum-v1"
SAC_MARKS = (5_000, 10_000, 20_000)
SAC_WINDOW = 1_000  # five Pendulum episodes before each mark
# The tuned example's pass mark: RLlib's episode_return_mean (the last 5 episodes) reaches -250 within 20k env steps
SAC_REACHED = -250.0
SAC_REACHED_EPISODES = 5
TIMER_RATE_HZ = 50.0
TIMER_MINUTES = 8.0  # 20k steps at 50 Hz take 6.7 minutes
PATHS = ("own", "ros")
PATH_TITLES = {"own": "RLlib's own SingleAgentEnvRunner", "ros": "plugrl-gym-robot + bridge + PlugRLEnvRunner"}
PROCESS_POLL_S = 0.25


# -- one run -----------------------------------------------------------------------------


@dataclass
class Run:
    path: str
    copies: int
    seed: int
    iterations: list[dict[str, float]]  # per training iteration: t, cpu, steps, sample_wall, sample_cpu (driver)
    episodes: list[tuple[float, float, int]]  # (ended at, return, length)
    processes: dict[str, list[tuple[float, float]]]  # robot / bridge: (t, CPU seconds) samples
    robot_idle_share: list[float]  # the runner's figure, per iteration (ros)


def bridge_config(env_id: str, copies: int, mode: str, tmp: Path) -> Path:
    """The bridge config ``plugrl-gym-robot --print-config`` prints for these copies, written to a file."""
    from plugrl_ros import executables

    config = tmp / f"gym_{env_id}_{copies}_{mode}.yaml"
    if not config.exists():
        printed = subprocess.run(
            executables.command("plugrl_ros.gym.robot_node", "--env", env_id, "--copies", str(copies), "--mode",
                                mode, "--rate", str(TIMER_RATE_HZ), "--print-config"),
            env=common.ros_env(), capture_output=True, text=True, check=True,
        )  # fmt: skip
        config.write_text(printed.stdout)
    return config


def state_dims(env_id: str) -> str:
    """``NAME=WIDTH,...`` of the env's states: the widths the printed config does not carry."""
    from plugrl_ros.gym.copies import GymCopy

    copy = GymCopy(env_id, 0, 0)
    try:
        return ",".join(f"{key.name}={key.size}" for key in copy.keys)
    finally:
        copy.close()


def run(
    algorithm: str, path: str, env_id: str, copies: int, seed: int, steps: int, tmp: Path,
    timer: bool = False, seconds: float = 0.0, learners: int = 0, horizon: int = 1,
) -> Run:  # fmt: skip
    """One training run of ``algorithm`` through ``path``; the driver's records and the clients' CPU."""
    from plugrl_ros import executables

    mode = "timer" if timer else "lockstep"
    params = bridge_config(env_id, copies, mode, tmp)
    out = tmp / f"run_{algorithm}_{path}_{copies}_{seed}_{mode}{'_learner' if learners else ''}_h{horizon}.json"
    out.unlink(missing_ok=True)
    driver_args = [
        "--algorithm", algorithm, "--runner", "own" if path == "own" else "plugrl", "--env", env_id,
        "--params-file", str(params), "--state-dims", state_dims(env_id), "--copies", str(copies),
        "--seed", str(seed), "--steps", str(steps), "--seconds", str(seconds), "--out", str(out),
        "--learners", str(learners), "--horizon", str(horizon),
    ]  # fmt: skip
    if timer:
        driver_args.append("--serve-during-updates")
    processes: dict[str, list[tuple[float, float]]] = {}
    with common.children() as started:
        driver = common.Child(common.python_script("rllib_driver.py", *driver_args))
        started.append(driver)
        clients: dict[str, common.Child] = {}
        if path == "ros":
            common.wait_for(lambda: _port(driver) is not None, 300, "the PlugRL runner to listen")
            robot = executables.command(
                "plugrl_ros.gym.robot_node", "--env", env_id, "--copies", str(copies), "--seed", str(seed),
                "--mode", mode, "--rate", str(TIMER_RATE_HZ),
            )  # fmt: skip
            bridge = common.bridge_command(
                None, "--ros-args", "--params-file", str(params), "-p", f"trainer.uri:=ws://127.0.0.1:{_port(driver)}",
                "-p", "status.log_period_s:=0.0", "--log-level", "warn",
            )  # fmt: skip
            for name, command in (("robot", robot), ("bridge", bridge)):
                clients[name] = common.Child(command)
                started.append(clients[name])
        import psutil

        meters = {name: psutil.Process(child.pid) for name, child in clients.items()}
        processes = {name: [] for name in meters}
        deadline = time.monotonic() + 4 * 3600
        while driver.alive():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {algorithm} {path} run did not end")
            for name, meter in meters.items():
                try:
                    cpu = meter.cpu_times()
                except psutil.NoSuchProcess:
                    raise RuntimeError(f"the {name} exited:\n{clients[name].output()[-3000:]}") from None
                processes[name].append((time.monotonic(), cpu.user + cpu.system))
            time.sleep(PROCESS_POLL_S)
        if driver.proc.wait() != 0 or not out.exists():
            raise RuntimeError(f"the {algorithm} {path} driver failed:\n{driver.output()[-4000:]}")
    saved = json.loads(out.read_text())
    return Run(
        path, copies, seed, saved["iterations"], [tuple(e) for e in saved["episodes"]], processes,
        saved["robot_idle_share"],
    )  # fmt: skip


def _port(driver: common.Child) -> int | None:
    if not driver.alive():
        raise RuntimeError(f"the driver exited:\n{driver.output()[-4000:]}")
    for line in driver.output().splitlines():
        if line.startswith("PORT "):
            return int(line.split()[1])
    return None


def _cpu_at(samples: list[tuple[float, float]], t: float) -> float:
    """A process's CPU seconds at ``t``, interpolated between the samples around it."""
    before = [s for s in samples if s[0] <= t]
    after = [s for s in samples if s[0] >= t]
    if not before:
        return samples[0][1]
    if not after:
        return samples[-1][1]
    (t0, c0), (t1, c1) = before[-1], after[0]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def per_step(run: Run, skip_steps: int) -> dict[str, float]:
    """Wall-clock and CPU per env step over the iterations after the first ``skip_steps`` env steps."""
    its = run.iterations
    first = next((i for i, it in enumerate(its) if it["steps"] >= skip_steps), 0)
    a, b = its[first], its[-1]
    steps = b["steps"] - a["steps"]
    if steps <= 0:
        raise RuntimeError(f"the {run.path} run stepped nothing after its first {skip_steps} steps")
    out = {
        "steps": float(steps),
        "wall": (b["t"] - a["t"]) / steps,
        "sample_wall": (b["sample_wall"] - a["sample_wall"]) / steps,
        "driver_cpu": (b["cpu"] - a["cpu"]) / steps,
        "sample_cpu": (b["sample_cpu"] - a["sample_cpu"]) / steps,
    }
    for name, samples in run.processes.items():
        out[f"{name}_cpu"] = (_cpu_at(samples, b["t"]) - _cpu_at(samples, a["t"])) / steps
    return out


# -- cost --------------------------------------------------------------------------------


def cost(seeds: int, steps: int, copy_counts: tuple[int, ...], tmp: Path) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for copies in copy_counts:
        for seed in range(seeds):
            for path in PATHS:  # interleaved: load on the shared cores hits both alike
                result = run("ppo", path, COST_ENV, copies, seed, steps, tmp)
                figures = per_step(result, skip_steps=min(1_000, steps // 2))
                rows.append({"path": path, "copies": copies, "seed": seed, **figures})
                print(f"cost, {copies} copies, seed {seed}, {path}: {_ms(figures['wall'])} ms per step", flush=True)
    return {"env": COST_ENV, "steps": steps, "rows": rows}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def cost_table(section: dict[str, Any]) -> str:
    rows = section["rows"]
    seeds = len({r["seed"] for r in rows})
    lines = [
        f"### RLlib PPO through ROS vs RLlib's own runner: cost per env step ({section['env']}, H = 1, lockstep, "
        f"{seeds} run(s) of {section['steps']:,} env steps per case, the first 1,000 left out; medians)",
        "",
    ]
    head = (
        "copies", "path", "wall-clock ms/step (updates included)", "÷ RLlib's own", "wall-clock ms/step sampling",
        "÷ RLlib's own", "runner CPU ms/step (in sample(); own: with the env)", "÷ RLlib's own",
        "driver CPU ms/step (runner + learner)", "robot CPU ms/step", "bridge CPU ms/step", "all processes ms/step",
    )  # fmt: skip
    body = []
    for copies in sorted({r["copies"] for r in rows}):
        med = {}
        for path in PATHS:
            mine = [r for r in rows if r["copies"] == copies and r["path"] == path]
            if mine:
                med[path] = {k: statistics.median(r[k] for r in mine) for k in mine[0] if k not in ("path", "seed")}
        if "own" not in med:
            continue
        own = med["own"]
        for path, m in med.items():
            total = m["driver_cpu"] + m.get("robot_cpu", 0.0) + m.get("bridge_cpu", 0.0)
            body.append((
                copies, PATH_TITLES[path], _ms(m["wall"]), common.fmt_ratio(m["wall"] / own["wall"]),
                _ms(m["sample_wall"]), common.fmt_ratio(m["sample_wall"] / own["sample_wall"]), _ms(m["sample_cpu"]),
                common.fmt_ratio(m["sample_cpu"] / own["sample_cpu"]), _ms(m["driver_cpu"]),
                _ms(m["robot_cpu"]) if "robot_cpu" in m else "-", _ms(m["bridge_cpu"]) if "bridge_cpu" in m else "-",
                _ms(total),
            ))  # fmt: skip
    lines.append(common.md_table(head, body))
    lines += [
        "",
        "Targets: the runner's CPU per env step at most RLlib's own runner's (which also steps the env); "
        "wall-clock per env step through ROS at most 2x RLlib's own at 1 copy, 1.25x at 8 copies.",
    ]
    return "\n".join(lines)


# -- SAC ---------------------------------------------------------------------------------


def returns_at(episodes: list[tuple[float, float, int]], marks: list[int], window: int) -> list[float]:
    """At each mark of env steps, the mean return of the episodes that ended in the ``window`` steps before it."""
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


def steps_to_reach(episodes: list[tuple[float, float, int]], target: float, last: int) -> int | None:
    """The env steps at the end of the first episode after which the mean return of the last ``last`` episodes
    was at least ``target`` (RLlib's ``episode_return_mean`` crossing it), or None if it never was."""
    total, returns = 0, []
    for _, ret, length in episodes:
        total += length
        returns.append(ret)
        if len(returns) >= last and statistics.fmean(returns[-last:]) >= target:
            return total
    return None


def sac(seeds: int, steps: int, tmp: Path) -> dict[str, Any]:
    runs: dict[str, list[Run]] = {path: [] for path in PATHS}
    for seed in range(seeds):
        for path in PATHS:  # interleaved: load on the shared cores hits both alike
            runs[path].append(run("sac", path, SAC_ENV, 1, seed, steps, tmp))
            print(f"sac, seed {seed}, {path}: {len(runs[path][-1].episodes)} episodes", flush=True)
    return sac_section(runs, steps)


def sac_section(runs: dict[str, list[Run]], steps: int) -> dict[str, Any]:
    """The SAC results of the runs of each path (seed by seed, the same seeds on both)."""
    marks = sorted({*(m for m in SAC_MARKS if m <= steps), steps})  # and the run's end
    window = min(SAC_WINDOW, marks[0])
    return {
        "env": SAC_ENV,
        "steps": steps,
        "seeds": [r.seed for r in runs["own"]],
        "marks": marks,
        "window": window,
        "returns": {path: [returns_at(r.episodes, marks, window) for r in runs[path]] for path in PATHS},
        "reached": {
            path: [steps_to_reach(r.episodes, SAC_REACHED, SAC_REACHED_EPISODES) for r in runs[path]] for path in PATHS
        },
        "per_step": {path: [per_step(r, skip_steps=0) for r in runs[path]] for path in PATHS},
    }


def saved_sac_runs(folder: Path, steps: int) -> dict[str, Any]:
    """The SAC section from the drivers' results files a run left in its folder (``--from-runs``), for the seeds
    both paths finished: an interrupted run's results."""
    runs: dict[str, list[Run]] = {path: [] for path in PATHS}
    seed = 0
    while all((folder / f"run_sac_{path}_1_{seed}_lockstep_h1.json").exists() for path in PATHS):
        for path in PATHS:
            saved = json.loads((folder / f"run_sac_{path}_1_{seed}_lockstep_h1.json").read_text())
            episodes = [tuple(e) for e in saved["episodes"]]
            runs[path].append(Run(path, 1, seed, saved["iterations"], episodes, {}, saved["robot_idle_share"]))
        seed += 1
    if not seed:
        raise SystemExit(f"{folder}: no seed with SAC results of both paths")
    return sac_section(runs, steps)


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.1f} ± {spread:.1f}"


def sac_table(section: dict[str, Any]) -> str:
    seeds = section["seeds"]
    lines = [
        f"### RLlib SAC through ROS vs RLlib's own runner: learning equivalence ({section['env']}, RLlib's tuned "
        f"Pendulum SAC, 1 copy, lockstep, H = 1, {len(seeds)} seed(s), {section['steps']:,} env steps per run)",
        "",
    ]
    head = ("env steps", "RLlib's own runner: return (mean ± std)", "through ROS: return (mean ± std)",
            "ROS - own", "within the seed spread")  # fmt: skip
    body = []
    for i, mark in enumerate(section["marks"]):
        own = [curve[i] for curve in section["returns"]["own"]]
        ros = [curve[i] for curve in section["returns"]["ros"]]
        gap = statistics.fmean(ros) - statistics.fmean(own)
        spread = max(statistics.stdev(own) if len(own) > 1 else 0.0, statistics.stdev(ros) if len(ros) > 1 else 0.0)
        body.append((f"{mark:,}", mean_std(own), mean_std(ros), f"{gap:+.1f}",
                     "yes" if abs(gap) <= spread else "no" if len(seeds) > 1 else "-"))  # fmt: skip
    lines.append(common.md_table(head, body))
    per = section["per_step"]
    own_wall = statistics.median(f["wall"] for f in per["own"])
    ros_wall = statistics.median(f["wall"] for f in per["ros"])
    reached = section.get("reached")
    if reached:  # results from before it was recorded have none
        lines += ["", common.md_table(
            ("seed", f"RLlib's own runner: env steps to {SAC_REACHED:g}", f"through ROS: env steps to {SAC_REACHED:g}"),
            [(seed, *(_steps(reached[path][i]) for path in PATHS)) for i, seed in enumerate(seeds)],
        )]  # fmt: skip
    lines += [
        "",
        f"(the return at a mark: the mean of the episodes ending in the {section['window']:,} env steps before it; "
        f"env steps to {SAC_REACHED:g}: until the mean of the last {SAC_REACHED_EPISODES} episodes first reached "
        "it, RLlib's pass mark for this example.) "
        f"Wall-clock per env step, the learner's updates included: {_ms(own_wall)} ms with RLlib's own runner, "
        f"{_ms(ros_wall)} ms through ROS ({common.fmt_ratio(ros_wall / own_wall)}x).",
    ]
    return "\n".join(lines)


def _steps(steps: int | None) -> str:
    return "not reached" if steps is None else f"{steps:,}"


def sac_timer(seeds: int, steps: int, minutes: float, tmp: Path, learners: int, horizon: int = 1) -> dict[str, Any]:
    runs = []
    for seed in range(seeds):
        result = run("sac", "ros", SAC_ENV, 1, seed, steps, tmp, timer=True, seconds=minutes * 60, learners=learners,
                     horizon=horizon)  # fmt: skip
        its = result.iterations
        t0 = its[0]["t"]
        idle = idle_shares(its, horizon)
        curve = [((t - t0) / 60, ret) for t, ret, _ in result.episodes]
        runs.append({"seed": seed, "steps": its[-1]["steps"], "minutes": (its[-1]["t"] - t0) / 60,
                     "idle_share": idle[0], "idle_share_learning": idle[-1], "episodes": curve,
                     "runner_idle_share": statistics.median(result.robot_idle_share) if result.robot_idle_share
                     else None})  # fmt: skip
        print(f"sac timer, seed {seed}: idle {idle}", flush=True)
    return {"env": SAC_ENV, "rate_hz": TIMER_RATE_HZ, "runs": runs, "learners": learners, "horizon": horizon,
            "switch_interval_ms": switch_interval_ms()}  # fmt: skip


def idle_shares(iterations: list[dict[str, float]], horizon: int) -> list[float]:
    """The control ticks without a step: over the whole run, then over the iterations the learner updated in
    (after warm-up), if there were two. RLlib counts RL steps, each a chunk of ``horizon`` control steps."""
    learning = [it for it in iterations if it["steps"] >= SAC_SETTINGS_LEARNING_STARTS]
    spans = [(iterations[0], iterations[-1])] + ([(learning[0], learning[-1])] if len(learning) > 1 else [])
    return [max(0.0, 1 - horizon * (b["steps"] - a["steps"]) / (TIMER_RATE_HZ * (b["t"] - a["t"]))) for a, b in spans]


def switch_interval_ms() -> float:
    """The serving runner's thread switch interval in its process: ``RunnerSettings.switch_interval_s``'s
    default, which the driver keeps."""
    from plugrl_ros.rllib import RunnerSettings

    return 1000 * (RunnerSettings().switch_interval_s or sys.getswitchinterval())


def interval_note(section: dict[str, Any]) -> str:
    """``, thread switch interval X ms`` for a sac-timer section that recorded it (older results did not)."""
    interval = section.get("switch_interval_ms")
    return "" if interval is None else f", thread switch interval {interval:g} ms"


def timer_setup(section: dict[str, Any]) -> str:
    """How a sac-timer section ran: the chunk's length, where the learner was, and the runner process's thread
    switch interval (results from before chunks were a setting ran at H = 1)."""
    where = f"{section['learners']} learner process(es) of its own" if section.get("learners") else (
        "the learner in the driver's process")  # fmt: skip
    return f"H = {section.get('horizon', 1)}, " + where + interval_note(section)


SAC_SETTINGS_LEARNING_STARTS = 256  # num_steps_sampled_before_learning_starts of the tuned SAC


def sac_timer_table(section: dict[str, Any]) -> str:
    runs = section["runs"]
    lines = [
        f"### RLlib SAC through ROS in real time ({section['env']}, plugrl-gym-robot in timer mode at "
        f"{section['rate_hz']:g} Hz, serve_during_updates, {len(runs)} seed(s), {timer_setup(section)})",
        "",
    ]
    head = ("seed", "minutes", "env steps", "return, first 5 episodes", "return, last 5 episodes",
            "control ticks idle (whole run)", "idle while the learner updates")  # fmt: skip
    body = []
    for r in runs:
        rets = [ret for _, ret in r["episodes"]]
        body.append((r["seed"], f"{r['minutes']:.1f}", f"{r['steps']:,}",
                     f"{statistics.fmean(rets[:5]):.1f}" if rets else "-",
                     f"{statistics.fmean(rets[-5:]):.1f}" if rets else "-",
                     f"{r['idle_share']:.1%}", f"{r['idle_share_learning']:.1%}"))  # fmt: skip
    lines.append(common.md_table(head, body))
    lines += ["", "Target: at most 5 % of control ticks idle while the learner updates."]
    return "\n".join(lines)


def timer_sections(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The sac-timer results: one section, or several rendered together (``--timer-json`` given more than once)."""
    timer = results.get("sac_timer") or []
    return [timer] if isinstance(timer, dict) else list(timer)


def plot(results: dict[str, Any], path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    panels = [k for k in ("sac", "sac_timer") if results.get(k)]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.5), squeeze=False)
    for ax, key in zip(axes[0], panels):
        section = results[key]
        if key == "sac":
            marks = np.asarray(section["marks"])
            for name, style in (("own", "-"), ("ros", "--")):
                curves = np.asarray(section["returns"][name])
                mean, std = curves.mean(axis=0), curves.std(axis=0, ddof=1 if len(curves) > 1 else 0)
                line = ax.plot(marks, mean, style, marker="o", label=f"{PATH_TITLES[name]} ({len(curves)} seeds)")[0]
                ax.fill_between(marks, mean - std, mean + std, alpha=0.15, color=line.get_color())
            ax.set_xlabel("env steps")
            ax.set_title(f"SAC on {section['env']}, lockstep: same config and seeds")
        else:
            for timer in timer_sections(results):
                where = f"{timer['learners']} learner process" if timer.get("learners") else "learner in the driver"
                where = f"H = {timer.get('horizon', 1)}, " + where + interval_note(timer)
                for r in timer["runs"]:
                    if r["episodes"]:
                        t, ret = zip(*r["episodes"])
                        idle = f"{r['idle_share_learning']:.0%} of ticks idle while learning"
                        ax.plot(t, ret, ".-", linewidth=0.8, label=f"seed {r['seed']}, {where}: {idle}")
            section = timer_sections(results)[0]
            ax.set_xlabel("wall-clock minutes")
            ax.set_title(f"SAC on {section['env']} through ROS, timer mode at {section['rate_hz']:g} Hz")
        ax.set_ylabel("episode return")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def tables(results: dict[str, Any]) -> str:
    parts = []
    if results.get("cost"):
        parts.append(cost_table(results["cost"]))
    if results.get("sac"):
        parts.append(sac_table(results["sac"]))
    parts += [sac_timer_table(section) for section in timer_sections(results)]
    return "\n\n".join(parts)


# -- main ----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_arguments(parser, repeat=1)
    parser.add_argument("--part", choices=("all", "cost", "sac", "sac-timer"), default="all")
    parser.add_argument("--seeds", type=int, default=3, help="SAC: seeds per path (default %(default)s)")
    parser.add_argument("--cost-runs", type=int, default=2, help="cost: runs per path and copy count")
    parser.add_argument("--steps", type=int, default=0, help="SAC: env steps per run (default 20,000)")
    parser.add_argument("--minutes", type=float, default=TIMER_MINUTES, help="SAC in timer mode: minutes per run")
    parser.add_argument(
        "--timer-learners", type=int, default=0, help="SAC in timer mode: learner processes (0: in the driver's)"
    )
    parser.add_argument("--timer-horizon", type=int, default=1, help="SAC in timer mode: control steps per chunk")
    parser.add_argument("--plot", default="", help="draw the SAC curves into this PNG")
    parser.add_argument("--from-runs", default="", help="SAC: the tables from the run files left in this folder")
    parser.add_argument(
        "--timer-json", action="append", default=[], help="with --from-runs: saved sac-timer results too (repeatable)"
    )
    args = parser.parse_args()
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("gymnasium") is None:
        parser.error("needs the gym and rllib extras: scripts/setup-venv.sh .venv kilted '' gym,rllib")
    cost_steps, cost_copies, sac_steps = COST_STEPS, COST_COPIES, args.steps or SAC_MARKS[-1]
    if args.quick:
        args.seeds, args.cost_runs, args.minutes = 1, 1, 0.25
        cost_steps, cost_copies, sac_steps = 1_200, (1,), 300
    if args.from_runs:
        results = {"sac": saved_sac_runs(Path(args.from_runs), sac_steps)}
        if args.timer_json:
            results["sac_timer"] = [json.loads(Path(f).read_text())["sac_timer"] for f in args.timer_json]
        print(tables(results))
        if args.plot:
            plot(results, Path(args.plot))
        common.save_json(args.json, "rllib", results)
        return 0
    common.use_own_domain()
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="bench-rllib-"))
    results: dict[str, Any] = {}
    if args.part in ("all", "cost"):
        results["cost"] = cost(args.cost_runs, cost_steps, cost_copies, tmp)
    if args.part in ("all", "sac"):
        results["sac"] = sac(args.seeds, sac_steps, tmp)
    if args.part in ("all", "sac-timer"):
        results["sac_timer"] = sac_timer(
            args.seeds, sac_steps, args.minutes, tmp, args.timer_learners, args.timer_horizon
        )
    print(tables(results))
    if args.plot:
        plot(results, Path(args.plot))
    common.save_json(args.json, "rllib", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
