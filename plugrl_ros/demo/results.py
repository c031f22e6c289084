"""The demo's results: finished episodes, their summary, the files a run leaves (plot, JSON, CSV, policy)."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from plugrl_ros.demo.policy_gradient import PolicyGradient

COMPARED_FRACTION = 0.1  # "first" and "last" in the summary: this share of the episodes each
# The plot is the demo's only use of matplotlib, so a robot's rosdep install does not pull it in.
NO_PLOT = "not drawn: matplotlib is not installed (pip install matplotlib, or apt install python3-matplotlib)"


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode, as the client reported it."""

    time_s: float  # since the first connection
    env: int
    ret: float
    length: int  # steps; 0 when the client did not say


def summarize(records: Sequence[EpisodeRecord], duration_s: float) -> dict[str, Any]:
    """Episodes, and the mean return of the first and last share of them."""
    returns = [r.ret for r in records]
    summary: dict[str, Any] = {"episodes": len(returns), "duration_s": round(duration_s, 1)}
    if returns:
        part = max(1, round(len(returns) * COMPARED_FRACTION))
        summary["compared_episodes"] = part
        summary["first_mean_return"] = round(float(np.mean(returns[:part])), 3)
        summary["last_mean_return"] = round(float(np.mean(returns[-part:])), 3)
        summary["improvement"] = round(summary["last_mean_return"] - summary["first_mean_return"], 3)
    return summary


def moving_average(values: Sequence[float], window: int) -> np.ndarray:
    """The mean of each ``window`` consecutive values (len(values) - window + 1 of them)."""
    data = np.asarray(values, dtype=np.float64)
    if window < 1 or len(data) < window:
        return np.zeros(0)
    cumulative = np.concatenate([[0.0], np.cumsum(data)])
    return (cumulative[window:] - cumulative[:-window]) / window


def write_results(output: str | Path, records: Sequence[EpisodeRecord], summary: Mapping[str, Any]) -> dict[str, str]:
    """Write summary.json, episodes.csv and (with matplotlib) returns.png into ``output``; their paths by name."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: str(out / name) for name in ("summary.json", "episodes.csv")}

    with open(paths["episodes.csv"], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time_s", "env", "return", "length"])
        for r in records:
            writer.writerow([f"{r.time_s:.3f}", r.env, f"{r.ret:.5f}", r.length])

    if plot_returns(out / "returns.png", records, summary):
        paths["returns.png"] = str(out / "returns.png")

    with open(paths["summary.json"], "w") as f:
        json.dump({**summary, "files": paths}, f, indent=2)
        f.write("\n")
    return paths


def write_policy(output: str | Path, learner: PolicyGradient) -> str | None:
    """Write the learned mean action as ``policy.npz`` (W, b; no pickle); its path, None if nothing was learned.

    The file is what ``plugrl-test-policy-server --linear`` serves; the learner
    reads the states concatenated in name order, so the server's state key
    lists them in that order (``--stamp-key state/joints,state/target``).
    """
    if learner.state_dim is None:
        return None
    W, b = learner.linear_policy()
    path = Path(output) / "policy.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, W=W, b=b)
    return str(path)


def plot_returns(path: Path, records: Sequence[EpisodeRecord], summary: Mapping[str, Any]) -> bool:
    """Draw episode return over time into ``path``; False (nothing drawn) without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False

    # The Agg canvas directly: no pyplot, so no display backend is ever looked for.
    figure = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    times = [r.time_s for r in records]
    returns = [r.ret for r in records]
    ax.scatter(times, returns, s=6, alpha=0.35, color="tab:blue", label="episode return")
    window = max(5, min(50, len(returns) // 10))
    smooth = moving_average(returns, window)
    if len(smooth):
        ax.plot(times[window - 1 :], smooth, color="tab:red", linewidth=2, label=f"moving average ({window} episodes)")
    deploy = summary.get("deploy")
    if isinstance(deploy, Mapping) and deploy.get("mean_return") is not None:
        # what the learned policy scored afterwards, served by a policy server (the bridge in deploy mode)
        ax.axhline(
            deploy["mean_return"],
            color="tab:green",
            linestyle="--",
            linewidth=2,
            label=f"deployed, no exploration noise: mean of {deploy['episodes']} episodes",
        )
    ax.set_xlabel("time since the bridge connected (s)")
    ax.set_ylabel("episode return")
    title = "plugrl_ros demo: reacher, " + f"{summary.get('episodes', 0)} episodes"
    if "first_mean_return" in summary:
        title += f"; mean return {summary['first_mean_return']:.2f} -> {summary['last_mean_return']:.2f}"
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if records:
        ax.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path)
    return True


def json_line(summary: Mapping[str, Any]) -> str:
    """The summary's scalar entries on one line, for a terminal."""
    shown = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}
    return "summary: " + ", ".join(f"{k} {v}" for k, v in shown.items())
