"""The demo's progress line: redrawn in place on a terminal, a plain line every few seconds otherwise."""

from __future__ import annotations

import shutil
from typing import IO

from plugrl_ros.demo.diagnostics import BridgeStatus, DeployStatus
from plugrl_ros.demo.trainer import TrainerStats

TTY_PERIOD_S = 1.0
PLAIN_PERIOD_S = 5.0


class Progress:
    """One status line, redrawn in place on a terminal; a plain line every few seconds otherwise."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._period = TTY_PERIOD_S if self._tty else PLAIN_PERIOD_S
        self._shown_at = -1e9
        self._drawn = False

    def due(self, now: float) -> bool:
        return now - self._shown_at >= self._period

    def show(self, now: float, text: str) -> None:
        self._shown_at = now
        if self._tty:
            width = shutil.get_terminal_size((120, 20)).columns - 1
            self._stream.write("\r\x1b[2K" + text[:width])
            self._drawn = True
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def done(self) -> None:
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = False


def status_line(stats: TrainerStats, bridge: BridgeStatus | None, steps_per_s: float | None, duration: float) -> str:
    """The progress line: connection, env steps/s, episodes, recent mean return, infer latency (fits 80 columns)."""
    if stats.finished:
        link = "run finished"
    elif stats.connected:
        link = "connected"
    elif stats.elapsed_s > 0:
        link = "DISCONNECTED"
    else:
        link = "waiting for the bridge"
    clock = f"{min(stats.elapsed_s, duration):3.0f}/{duration:g} s"
    rate = "-" if steps_per_s is None else f"{steps_per_s:.0f}"
    ret = "-" if stats.recent_mean_return is None else f"{stats.recent_mean_return:.2f}"
    infer = "-" if bridge is None or bridge.infer_ms is None else f"{bridge.infer_ms:.1f} ms"
    return f"{clock} | {link} | {rate} steps/s | {stats.episodes} episodes | return {ret} | infer {infer}"


def deploy_status_line(status: DeployStatus | None, elapsed_s: float, duration: float) -> str:
    """The deploy step's progress line: time, policy server link, episodes, mean return, request latency."""
    clock = f"deploy {min(elapsed_s, duration):3.0f}/{duration:g} s"
    if status is None:
        return f"{clock} | waiting for the bridge"
    link = f"policy server {status.connected}/{status.robots} connected"
    ret = "-" if status.mean_return is None else f"{status.mean_return:.2f}"
    latency = "-" if status.latency_ms is None else f"{status.latency_ms:.1f} ms"
    return f"{clock} | {link} | {status.episodes} episodes | mean return {ret} | request {latency}"
