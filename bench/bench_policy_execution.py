"""Deploy stepping: idle steps and boundary jumps of sync / switch / ensemble / crossfade, by server latency.

Run: ``python bench/bench_policy_execution.py [--quick] [--repeat R] [--json PATH]``.

A deterministic simulation of the stepping core alone (:class:`PolicyRunner`
with a fake clock, 50 Hz ticks, no ROS, no network), so that it measures the
execution rules and nothing else. The policy tracks a smooth target
``sin(2 pi 0.5 t)``; each chunk carries a model error of its own (an offset,
plus a drift that grows along the chunk), so consecutive chunks disagree
where they meet, as real ones do. Each answer takes the latency given, plus
a uniform jitter of a fifth of it.

Columns: *idle %* is the share of ticks with no action after the first one
ran (the robot holds or stops); *boundary jump / in-chunk* is the largest
step between consecutive published actions at the tick a new chunk takes
effect (an idle tick holds the last action, so a jump after idling counts
from it), over the largest step inside any chunk the server sent (1 means a
boundary is no rougher than the policy itself); *error* is the mean distance
from the target (what smoothing costs in lag, and what running stale rows
costs ``sync``). With one request in flight per connection, asynchronous
execution keeps up only while the latency is under half the chunk (the
rest of a chunk must cover the next request's round trip). A latency longer than the
chunk (300 ms is 15 ticks, more than H = 10) leaves every asynchronous
chunk stale on arrival: all are dropped and the robot never moves, which is
the rule (it never replays a step whose moment has passed). ``sync`` is the baseline the
others are read against: it is what a client that waits for each chunk does.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common

from plugrl_ros.policy.execution import MODES, ExecutionSettings
from plugrl_ros.policy.runner import PolicyRunner

RATE_HZ = 50.0
PERIOD = 1.0 / RATE_HZ
LATENCIES_MS = (0, 50, 150, 300)
HORIZONS = (10, 50)
CHUNK_OFFSET = 0.05  # per-chunk model error: an offset ...
CHUNK_DRIFT = 0.10  # ... and a drift reaching this at the chunk's end


class _Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def target(tick: int) -> float:
    return math.sin(2 * math.pi * 0.5 * tick * PERIOD)


def simulate(mode: str, horizon: int, latency_s: float, ticks: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    noise = np.random.default_rng(seed)
    clock = _Clock()
    runner = PolicyRunner(ExecutionSettings(mode=mode), PERIOD, clock)
    runner.on_connected()
    in_flight: list[tuple[float, int, np.ndarray]] = []
    in_chunk = 0.0
    takeovers: set[int] = set()
    published: list[float | None] = []
    for i in range(ticks):
        now = i * PERIOD
        for arrival, number, actions in sorted(a for a in in_flight if a[0] <= now):
            clock.now = arrival
            if runner.on_chunk(number, actions) == "applied":
                takeovers.add(i)
        in_flight = [a for a in in_flight if a[0] > now]
        clock.now = now
        action = runner.step()
        published.append(None if action is None else float(action[0]))
        if runner.wants_request():
            number = runner.requested()
            s = runner.tick
            k = np.arange(horizon)
            error = noise.normal(0, CHUNK_OFFSET) + noise.normal(0, CHUNK_DRIFT) * k / horizon
            rows = np.array([target(s + j) for j in k]) + error
            in_chunk = max(in_chunk, float(np.abs(np.diff(rows)).max()) if horizon > 1 else 0.0)
            in_flight.append((now + latency_s * (1 + rng.uniform(0, 0.2)), number, rows[:, None]))
    first = next((i for i, a in enumerate(published) if a is not None), None)
    if first is None:  # every answer came after its chunk's last step: all dropped as stale
        return {"idle": 1.0, "jump_ratio": float("nan"), "error": float("nan")}
    ran = published[first:]
    # an idle tick holds the last action (the usual idle behaviour): a jump is measured from it
    boundary, held = 0.0, ran[0]
    for j in range(1, len(ran)):
        if ran[j] is None:
            continue
        if first + j in takeovers:
            boundary = max(boundary, abs(ran[j] - held))
        held = ran[j]
    errors = [abs(a - target(first + j)) for j, a in enumerate(ran) if a is not None]
    return {
        "idle": sum(a is None for a in ran) / len(ran),
        "jump_ratio": boundary / in_chunk if in_chunk else float("nan"),
        "error": float(np.mean(errors)),
    }


def measure(ticks: int, repeat: int) -> list[dict[str, Any]]:
    rows = []
    for horizon in HORIZONS:
        for latency_ms in LATENCIES_MS:
            for mode in MODES:
                runs = [simulate(mode, horizon, latency_ms / 1000, ticks, seed) for seed in range(repeat)]
                rows.append(
                    {
                        "horizon": horizon,
                        "latency_ms": latency_ms,
                        "mode": mode,
                        **{key: common.median([r[key] for r in runs]) for key in runs[0]},
                    }
                )
    return rows


def tables(results: dict[str, Any]) -> str:
    head = ("H", "latency ms", "mode", "idle %", "idle / sync", "boundary jump / in-chunk", "error", "error / sync")
    sync = {(r["horizon"], r["latency_ms"]): r for r in results["rows"] if r["mode"] == "sync"}
    body = []
    for r in results["rows"]:
        base = sync[(r["horizon"], r["latency_ms"])]
        body.append(
            (
                r["horizon"],
                r["latency_ms"],
                r["mode"],
                f"{100 * r['idle']:.1f}",
                common.fmt_ratio(r["idle"] / base["idle"]) if base["idle"] else "-",
                common.fmt_ratio(r["jump_ratio"]),
                "-" if r["error"] != r["error"] else f"{r['error']:.3f}",
                common.fmt_ratio(r["error"] / base["error"]),
            )
        )
    title = (
        f"### Deploy stepping ({RATE_HZ:g} Hz, simulated server latency + up to 20 % jitter, "
        f"{results['ticks']} ticks, median of {results['repeat']} seeds)"
    )
    return title + "\n\n" + common.md_table(head, body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_arguments(parser, repeat=5)
    args = parser.parse_args()
    ticks, repeat = (500, 1) if args.quick else (5000, args.repeat)
    results = {"rows": measure(ticks, repeat), "ticks": ticks, "repeat": repeat}
    print(tables(results))
    common.save_json(args.json, "policy_execution", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
