"""The demo's view of the bridge: what its /diagnostics say, read by a small ROS node in the demo's process."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plugrl_ros.tools.bridge_watch import BridgeWatch, Statuses

RATE_WINDOW_S = 5.0


@dataclass(frozen=True)
class BridgeStatus:
    """What the bridge last said on /diagnostics."""

    received_at: float
    connected: bool
    infer_ms: float | None  # the bridge's median infer round trip over its recent infers
    steps: int  # env steps, all envs
    episodes: int
    reconnects: int  # connections lost or resynced since the bridge started
    person_steps: int = 0  # with a person in the loop: the steps the person commanded, all envs


def parse_diagnostics(statuses: Statuses, received_at: float) -> BridgeStatus | None:
    """The bridge's status from a /diagnostics message's statuses (None if the bridge is not among them)."""
    trainer = None
    steps = episodes = person = 0
    for name, (_, values) in statuses.items():
        if name.endswith(": trainer") and "infer round trip median ms" in values:
            trainer = values
        elif ": env " in name and "steps" in values:
            steps += _int(values.get("steps"))
            episodes += _int(values.get("episodes"))
            person += _int(values.get("person steps"))
    if trainer is None:
        return None
    try:
        infer_ms: float | None = float(trainer["infer round trip median ms"])
    except ValueError:
        infer_ms = None  # "-": no infer yet
    connected = trainer.get("connected") == "True"
    return BridgeStatus(received_at, connected, infer_ms, steps, episodes, _int(trainer.get("reconnects")), person)


@dataclass(frozen=True)
class DeployStatus:
    """What the bridge in deploy mode last said on /diagnostics, summed over its robots."""

    received_at: float
    connected: int  # robots connected to the policy server
    robots: int
    episodes: int
    return_sum: float  # of every finished episode (each robot's mean return times its episodes)
    successes: int
    steps: int  # control ticks that applied a policy action
    idle_steps: int  # ticks at a chunk boundary with nothing left to apply
    latency_ms: float | None  # the largest of the robots' median request latencies

    @property
    def mean_return(self) -> float | None:
        return self.return_sum / self.episodes if self.episodes else None


def parse_deploy_diagnostics(statuses: Statuses, received_at: float) -> DeployStatus | None:
    """The deploy-mode bridge's status from a /diagnostics message's statuses (None if it is not among them)."""
    link = None
    episodes = successes = steps = idle = 0
    return_sum = 0.0
    latencies = []
    for name, (_, values) in statuses.items():
        if name.endswith(": policy server") and "connected robots" in values:
            link = values
        elif ": env " in name and "mean return" in values:
            n = _int(values.get("episodes"))
            episodes += n
            successes += _int(values.get("successes"))
            steps += _int(values.get("steps"))
            idle += _int(values.get("idle steps at boundaries"))
            mean = _float(values.get("mean return"))
            if n and mean is not None:
                return_sum += n * mean
            latency = _float(values.get("request latency median ms"))
            if latency is not None:
                latencies.append(latency)
    if link is None:
        return None
    connected, _, robots = link["connected robots"].partition("/")
    return DeployStatus(
        received_at,
        _int(connected),
        _int(robots),
        episodes,
        return_sum,
        successes,
        steps,
        idle,
        max(latencies) if latencies else None,
    )


def _float(text: str | None) -> float | None:
    try:
        return float(text or "")
    except ValueError:
        return None  # "-": nothing measured yet


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


class DiagnosticsWatch:
    """Keeps the bridge's latest /diagnostics, from a small ROS node in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: BridgeStatus | None = None
        self._deploy: DeployStatus | None = None
        self._history: deque[BridgeStatus] = deque(maxlen=4000)
        self._watch = BridgeWatch("plugrl_demo_progress", self._on_statuses)

    def _on_statuses(self, statuses: Statuses, received_at: float) -> None:
        deploy = parse_deploy_diagnostics(statuses, received_at)
        if deploy is not None:
            with self._lock:
                self._deploy = deploy
            return
        status = parse_diagnostics(statuses, received_at)
        if status is not None:
            with self._lock:
                self._latest = status
                self._history.append(status)

    @property
    def latest(self) -> BridgeStatus | None:
        with self._lock:
            return self._latest

    @property
    def deploy(self) -> DeployStatus | None:
        """The deploy-mode bridge's latest status."""
        with self._lock:
            return self._deploy

    def history(self) -> list[BridgeStatus]:
        with self._lock:
            return list(self._history)

    def steps_per_s(self) -> float | None:
        """Env steps per second over the last few seconds of reports."""
        with self._lock:
            if not self._history:
                return None
            last = self._history[-1]
            window = [s for s in self._history if s.received_at >= last.received_at - RATE_WINDOW_S]
        first = window[0]
        if last.received_at - first.received_at < 0.5:
            return None
        return (last.steps - first.steps) / (last.received_at - first.received_at)

    def close(self) -> None:
        self._watch.close()


def intervention_summary(history: Sequence[BridgeStatus], helping_minutes: float) -> dict[str, Any]:
    """The person's share of the steps, over the run and minute by minute, from the bridge's /diagnostics."""
    if not history:
        return {"person_steps": 0, "share": None, "share_by_minute": [], "helping_minutes": helping_minutes}
    last, start = history[-1], history[0].received_at
    by_minute: list[float | None] = []
    before = history[0]
    for minute in range(1, int((last.received_at - start) // 60.0) + 2):
        inside = [s for s in history if s.received_at <= start + 60.0 * minute]
        end = inside[-1]
        steps = end.steps - before.steps
        by_minute.append(round((end.person_steps - before.person_steps) / steps, 4) if steps > 0 else None)
        before = end
    return {
        "person_steps": last.person_steps,
        "share": round(last.person_steps / last.steps, 4) if last.steps else None,
        "share_by_minute": by_minute,
        "helping_minutes": helping_minutes,
    }
