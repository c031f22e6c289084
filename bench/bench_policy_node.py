"""Policy mode through the real bridge process: achieved step rate, idle steps and request latency.

Run: ``python bench/bench_policy_node.py [--quick] [--seconds S] [--json PATH]``.

Real processes over DDS: ``sensor_node.py`` (two robots, each a 14-joint
JointState at 100 Hz), the bridge at 50 Hz, and either a PlugRL trainer
(``bench_trainer.py``, answering at once: the baseline, train mode with the
same robots in the same run) or ``plugrl-test-policy-server`` (deploy mode,
one connection per robot) answering after a fixed latency. H = 10 in both.

Train mode's env steps are counted by its trainer (each step fed back);
deploy mode's by the bridge's /diagnostics (ticks that applied a policy
action, ticks idle at a chunk boundary, request latency median and p95 as
the bridge measured them). The ideal is one step per robot per tick.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from bench_observation import JOINTS, bridge_params

RATE_HZ = 50.0
ENVS = 2
HORIZON = 10
# (execution, server latency s): switch with an instant and a 50 ms server, and sync beside it for what
# asynchronous execution saves
DEPLOY_CASES = (("switch", 0.0), ("switch", 0.05), ("sync", 0.05))


class Diagnostics:
    """The bridge's latest /diagnostics entries per robot, read by a node in this process."""

    def __init__(self) -> None:
        from plugrl_ros.tools.bridge_watch import BridgeWatch

        common.use_own_domain()
        self._lock = threading.Lock()
        self.latest: dict[int, dict[str, str]] = {}
        self.received = 0
        self._watch = BridgeWatch("bench_policy_diagnostics", self._on_statuses)

    def _on_statuses(self, statuses: dict[str, tuple[str, dict[str, str]]], received_at: float) -> None:
        entries = {}
        for name, (_, values) in statuses.items():
            if ": env " in name and "idle steps at boundaries" in values:  # a deploy-mode robot
                entries[int(name.split(": env ", 1)[1].split()[0])] = values
        if len(entries) == ENVS:
            with self._lock:
                self.latest = entries
                self.received += 1

    def snapshot(self) -> tuple[int, dict[int, dict[str, str]]]:
        with self._lock:
            return self.received, dict(self.latest)

    def next_snapshot(self, timeout: float) -> dict[int, dict[str, str]]:
        """The first complete report after now."""
        mark = self.snapshot()[0]
        common.wait_for(lambda: self.snapshot()[0] > mark, timeout, "the bridge's /diagnostics")
        return self.snapshot()[1]

    def close(self) -> None:
        self._watch.close()


def params_for(params_dir: Path, **extra: Any) -> Path:
    params = bridge_params("none", ENVS)
    params.update({"control.rate_hz": RATE_HZ, "status.diagnostics_period_s": 0.25, **extra})
    return common.write_params(params_dir / "bridge.yaml", params)


def run_train(seconds: float, warmup: float) -> dict[str, Any]:
    with common.children() as started, tempfile.TemporaryDirectory() as params_dir:
        trainer = common.TrainerChild("--horizon", str(HORIZON), "--action-dim", str(len(JOINTS)), "--reuse")
        started.append(trainer)
        started.append(common.Child(common.python_script("sensor_node.py", "--envs", str(ENVS), "--camera", "none")))
        path = params_for(Path(params_dir), **{"trainer.uri": trainer.uri})
        started.append(
            common.Child(common.python_module("plugrl_ros.node.bridge_main", "--ros-args", "--params-file", str(path)))
        )
        common.wait_for(lambda: trainer.stats()["steps"] > 4 * ENVS, 60.0, "the train-mode bridge's first steps")
        time.sleep(warmup)
        before = trainer.stats()
        time.sleep(seconds)
        after = trainer.stats()
        _check_alive(started, "train")
    wire = common.difference(after, before)
    per_robot = wire["steps"] / wire["t"] / ENVS
    return {"case": "train (PlugRL trainer)", "latency_ms": 0.0, "steps_per_s": per_robot, "idle_pct": None}


def run_deploy(diagnostics: Diagnostics, execution: str, latency_s: float, seconds: float, warmup: float) -> dict:
    port = _free_port()
    server = common.python_module(
        "plugrl_ros.tools.test_policy_server",
        *("--port", str(port), "--horizon", str(HORIZON), "--action-dim", str(len(JOINTS))),
        *("--latency", str(latency_s)),
    )
    with common.children() as started, tempfile.TemporaryDirectory() as params_dir:
        started.append(common.Child(server))
        common.wait_for(lambda: "listening on" in started[0].output(), 30.0, "the policy server")
        started.append(common.Child(common.python_script("sensor_node.py", "--envs", str(ENVS), "--camera", "none")))
        path = params_for(
            Path(params_dir),
            **{
                "mode": "deploy",
                "policy.uri": f"ws://127.0.0.1:{port}",
                "policy.observations.observation.state": "states.joints",
                "policy.action_horizon": HORIZON,
                "policy.action_dim": len(JOINTS),
                "policy.execution.mode": execution,
            },
        )
        started.append(
            common.Child(common.python_module("plugrl_ros.node.bridge_main", "--ros-args", "--params-file", str(path)))
        )

        def stepping() -> bool:
            latest = diagnostics.snapshot()[1]
            return len(latest) == ENVS and all(int(v["steps"]) > 4 for v in latest.values())

        common.wait_for(stepping, 60.0, "the deploy-mode bridge's first steps")
        time.sleep(warmup)
        before, t0 = diagnostics.next_snapshot(10.0), time.monotonic()
        time.sleep(seconds)
        after, t1 = diagnostics.next_snapshot(10.0), time.monotonic()
        _check_alive(started, "deploy")
    steps = sum(int(after[i]["steps"]) - int(before[i]["steps"]) for i in range(ENVS))
    idle = sum(
        int(after[i]["idle steps at boundaries"]) - int(before[i]["idle steps at boundaries"]) for i in range(ENVS)
    )
    medians = [_ms(after[i]["request latency median ms"]) for i in range(ENVS)]
    p95s = [_ms(after[i]["request latency p95 ms"]) for i in range(ENVS)]
    return {
        "case": f"deploy {execution} (policy server, {latency_s * 1000:g} ms)",
        "latency_ms": latency_s * 1000,
        "steps_per_s": steps / (t1 - t0) / ENVS,
        "idle_pct": 100.0 * idle / max(1, steps + idle),
        "request_median_ms": max(medians),
        "request_p95_ms": max(p95s),
    }


def _ms(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _check_alive(started: list[common.Child], what: str) -> None:
    for child in started:
        if not child.alive():
            raise RuntimeError(f"a {what} child exited:\n" + child.output()[-3000:])


def tables(results: dict[str, Any]) -> str:
    rows = results["rows"]
    train = next((r["steps_per_s"] for r in rows if r["case"].startswith("train")), None)
    head = ("case", "env steps/s per robot", "÷ rate_hz", "vs train", "idle %", "request ms median / p95")
    body = [
        (
            r["case"],
            f"{r['steps_per_s']:.1f}",
            f"{r['steps_per_s'] / RATE_HZ:.2f}",
            common.fmt_ratio(r["steps_per_s"] / train) if train else "-",
            "-" if r["idle_pct"] is None else f"{r['idle_pct']:.1f}",
            f"{r['request_median_ms']:.1f} / {r['request_p95_ms']:.1f}" if "request_median_ms" in r else "-",
        )
        for r in rows
    ]
    title = (
        f"### Policy mode through the bridge process ({ENVS} robots, 14-joint JointState, H = {HORIZON}, "
        f"at {RATE_HZ:g} Hz; baseline: train mode, same robots, same run)"
    )
    return title + "\n\n" + common.md_table(head, body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_arguments(parser, repeat=1)
    parser.add_argument("--seconds", type=float, default=6.0, help="measurement window per run")
    args = parser.parse_args()
    seconds, warmup = (1.5, 0.5) if args.quick else (args.seconds, 1.5)
    cases = DEPLOY_CASES[:1] if args.quick else DEPLOY_CASES
    diagnostics = Diagnostics()
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        for _ in range(args.repeat):
            # interleaved, so load changes hit the baseline and policy mode alike
            row = run_train(seconds, warmup)
            runs.setdefault(row["case"], []).append(row)
            for execution, latency in cases:
                row = run_deploy(diagnostics, execution, latency, seconds, warmup)
                runs.setdefault(row["case"], []).append(row)
    finally:
        diagnostics.close()
    rows = [_median_row(same) for same in runs.values()]
    results = {"benchmark": "policy_node", "rate_hz": RATE_HZ, "horizon": HORIZON, "rows": rows}
    print(tables(results))
    common.save_json(args.json, "policy_node", results)
    return 0


def _median_row(same: list[dict[str, Any]]) -> dict[str, Any]:
    row = dict(same[0])
    for key in ("steps_per_s", "idle_pct", "request_median_ms", "request_p95_ms"):
        if key in row and row[key] is not None:
            row[key] = common.median([r[key] for r in same])
    return row


if __name__ == "__main__":
    sys.exit(main())
