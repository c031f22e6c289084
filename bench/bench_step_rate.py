"""Timer-mode env step rate: how many env steps per second each robot makes at a given control rate.

Run: ``python bench/bench_step_rate.py [--quick] [--seconds S] [--baseline REV] [--json PATH]``.

Real processes over DDS: ``sensor_node.py`` (two robots, each a 14-joint
JointState at 100 Hz, no cameras, no episodes ending: nothing but stepping
is measured), the bridge in timer mode at 50 Hz, and ``bench_trainer.py``
answering at once with chunks of H = 1 and H = 5 steps; the trainer counts
the env steps it is fed back. The ideal is one step per robot per tick: the
table shows steps/s per robot and its ratio to ``rate_hz``.

The baseline is the same measurement, in the same run, with the bridge and
probe robot of an earlier commit (``--baseline``, default: the last commit
before timer mode published a new chunk's first step on its arrival, when a
one-step chunk took two ticks). It is taken from git into a temporary folder;
without git (or with ``--baseline ''``) only the current code is measured.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from bench_observation import JOINTS, bridge_params

# The last commit whose timer mode published a new chunk's first step only at the next tick.
BASELINE_REV = "ccfbe56"
RATE_HZ = 50.0
ENVS = 2
HORIZONS = (1, 5)


def extract(rev: str, into: Path) -> Path | None:
    """The package of ``rev`` in ``into``; None if git cannot give them."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(common.ROOT), "archive", rev, "plugrl_ros"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return into


def bridge_command(tree: Path, params_dir: Path, uri: str) -> list[str]:
    params = bridge_params("none", ENVS)
    params.update({"trainer.uri": uri, "control.rate_hz": RATE_HZ})
    path = common.write_params(params_dir / "bridge.yaml", params)
    return common.bridge_command(tree, "--ros-args", "--params-file", str(path))


def run_one(code: str, tree: Path, horizon: int, seconds: float, warmup: float) -> dict[str, Any]:
    # the children import plugrl_ros from ``tree`` (python -m puts the working directory first)
    with common.children() as started, tempfile.TemporaryDirectory() as params_dir:
        trainer = common.TrainerChild("--horizon", str(horizon), "--action-dim", str(len(JOINTS)), "--reuse")
        started.append(trainer)
        sensors = common.python_script("sensor_node.py", "--envs", str(ENVS), "--camera", "none")
        started.append(common.Child(sensors))
        bridge = bridge_command(tree, Path(params_dir), trainer.uri)
        started.append(common.Child(bridge, env=common.ros_env(PYTHONPATH=str(tree)), cwd=str(tree)))
        common.wait_for(lambda: trainer.stats()["steps"] > 4 * ENVS, 60.0, f"the {code} bridge's first steps")
        time.sleep(warmup)
        before = trainer.stats()
        time.sleep(seconds)
        after = trainer.stats()
        for child in started[1:]:
            if not child.alive():
                raise RuntimeError(f"a {code} child exited:\n" + child.output()[-3000:])
    wire = common.difference(after, before)
    per_robot = wire["steps"] / wire["t"] / ENVS
    return {"code": code, "horizon": horizon, "steps_per_s_per_robot": per_robot, "ratio": per_robot / RATE_HZ}


def tables(results: dict[str, Any]) -> str:
    rows = results["rows"]
    before = {r["horizon"]: r["ratio"] for r in rows if r["code"] == "before"}
    head = ("code", "H", "rate Hz", "env steps/s per robot", "steps/s ÷ rate_hz", "vs before")
    body = [
        (
            r["code"],
            r["horizon"],
            f"{RATE_HZ:g}",
            f"{r['steps_per_s_per_robot']:.1f}",
            f"{r['ratio']:.2f}",
            common.fmt_ratio(r["ratio"] / before[r["horizon"]]) if r["horizon"] in before else "-",
        )
        for r in rows
    ]
    title = (
        f"### Timer-mode step rate ({ENVS} robots, 14-joint JointState, at {RATE_HZ:g} Hz; "
        f"before = {results['baseline'] or 'none'})"
    )
    return title + "\n\n" + common.md_table(head, body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_arguments(parser, repeat=1)
    parser.add_argument("--seconds", type=float, default=6.0, help="measurement window per run")
    parser.add_argument("--baseline", default=BASELINE_REV, help="git revision measured as 'before' ('' = none)")
    args = parser.parse_args()
    seconds, warmup = (1.5, 0.5) if args.quick else (args.seconds, 1.5)
    horizons = HORIZONS[:1] if args.quick else HORIZONS
    rows = []
    with tempfile.TemporaryDirectory(prefix="plugrl-bench-baseline-") as tmp:
        baseline = extract(args.baseline, Path(tmp)) if args.baseline and not args.quick else None
        codes = [("after", common.ROOT)] + ([("before", baseline)] if baseline is not None else [])
        for _ in range(args.repeat):
            for horizon in horizons:
                for code, tree in codes:  # interleaved, so load changes hit both alike
                    rows.append(run_one(code, tree, horizon, seconds, warmup))
    rows = _medians(rows)
    results = {"benchmark": "step_rate", "baseline": args.baseline if len(rows) > len(horizons) else "", "rows": rows}
    print(tables(results))
    common.save_json(args.json, "step_rate", results)
    return 0


def _medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (code, H): the median over the repetitions."""
    keys = sorted({(r["code"], r["horizon"]) for r in rows}, key=lambda k: (k[1], k[0] != "before"))
    out = []
    for code, horizon in keys:
        same = [r for r in rows if (r["code"], r["horizon"]) == (code, horizon)]
        per_robot = common.median([r["steps_per_s_per_robot"] for r in same])
        out.append({"code": code, "horizon": horizon, "steps_per_s_per_robot": per_robot, "ratio": per_robot / RATE_HZ})
    return out


if __name__ == "__main__":
    sys.exit(main())
