"""The bridge's status as diagnostic_msgs: trainer link, control loop, and one entry per env."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from plugrl_ros.record.recorder import RecorderState, RecorderStatus
from plugrl_ros.robot.env_io import EnvIO
from plugrl_ros.robot.robot_side import RobotSide
from plugrl_ros.rollout.env_rollout import EnvRollout
from plugrl_ros.train.train_mode import TrainMode

OK = DiagnosticStatus.OK
WARN = DiagnosticStatus.WARN
ERROR = DiagnosticStatus.ERROR


@dataclass
class Entry:
    """One diagnostic status under construction."""

    name: str
    level: bytes = OK
    message: str = "ok"
    values: dict[str, str] = field(default_factory=dict)

    def worse(self, level: bytes, message: str) -> None:
        """Raise the level (never lower it) and say why."""
        if ord(level) > ord(self.level):
            self.level = level
            self.message = message


def status_array(entries: list[Entry], hardware_id: str, stamp: object) -> DiagnosticArray:
    array = DiagnosticArray()
    array.header.stamp = stamp
    for entry in entries:
        status = DiagnosticStatus(level=entry.level, name=entry.name, message=entry.message, hardware_id=hardware_id)
        status.values = [KeyValue(key=k, value=str(v)) for k, v in entry.values.items()]
        array.status.append(status)
    return array


def percentile_ms(values: list[float], q: float) -> str:
    """The q-quantile of ``values`` (seconds) in milliseconds, or '-' if there are none."""
    if not values:
        return "-"
    ordered = sorted(values)
    index = min(len(ordered) - 1, round(q * (len(ordered) - 1)))
    return f"{ordered[index] * 1000:.1f}"


def env_state(io: EnvIO, env: EnvRollout, mode: TrainMode, paused: bool, now_ns: int) -> tuple[bytes, str]:
    """One env's level and a sentence on what it is doing (or what keeps it from stepping)."""
    stale = io.stale_sources(now_ns)
    if io.resetting:
        if io.reset.failures:
            return WARN, f"reset failing ({io.reset.failures}x): {io.reset.last_error}"
        return OK, f"resetting ({io.reset.state.value})"
    if stale:
        if all(reason.endswith("(nothing new since the reset)") for reason in stale):
            return OK, "waiting for fresh observations after the reset"
        return WARN, "stale: " + "; ".join(stale)
    if unheard := io.unheard_problem():
        return WARN, unheard
    if io.problem:
        return WARN, io.problem
    if paused:
        return OK, "paused"
    if env.chunk is not None:
        waited = time.monotonic() - io.step_sent_s
        if env.step_in_flight and waited > max(1.0, 0.5 * mode.config.control.env_timeout_s):
            waiting = ", ".join(io.step_waiting_for()) or "its step result"
            return WARN, f"step result overdue ({waited:.1f} s): waiting for {waiting}"
        return OK, "running"
    if env.pending is not None:
        return OK, "chunk done, feedback queued"
    return OK, "waiting for the trainer" if mode.rollout.connected else "waiting for the trainer connection"


class UplinkMeter:
    """Uplink bytes per env step between two reports: with the step rate, whether the link is the limit."""

    def __init__(self) -> None:
        self._mark = (0, 0)  # (bytes sent, env steps) at the last report

    def bytes_per_step(self, bytes_sent: int, steps: int) -> str:
        last_bytes, last_steps = self._mark
        self._mark = (bytes_sent, steps)
        if steps == last_steps:
            return "-"
        return f"{(bytes_sent - last_bytes) / (steps - last_steps):,.0f}"


def bridge_status(
    prefix: str, robot: RobotSide, mode: TrainMode, waiting_for_clock: bool, uplink: UplinkMeter
) -> list[Entry]:
    """The bridge's diagnostics: the trainer link, the control loop, and one entry per env."""
    config = mode.config
    now_ns = robot.now_ns()
    rollout = mode.rollout
    client = mode.link.client
    trainer = Entry(f"{prefix}: trainer")
    trainer.values = {
        "uri": config.trainer.uri,
        "connected": str(rollout.connected),
        "connections": str(rollout.connections),
        "reconnects": str(mode.reconnects),
        "last close": mode.last_close or "-",
        "infer round trip median ms": percentile_ms(list(rollout.infer_latencies), 0.5),
        "infer round trip p95 ms": percentile_ms(list(rollout.infer_latencies), 0.95),
        "actions received": str(rollout.actions_received),
        "feedbacks sent": str(rollout.feedbacks_sent),
        "bytes sent": str(client.bytes_sent),
        "bytes received": str(client.bytes_received),
        "bytes sent per env step": uplink.bytes_per_step(client.bytes_sent, sum(e.steps_total for e in rollout.envs)),
    }
    if rollout.metadata is not None:
        trainer.values.update({f"trainer {k}": v for k, v in rollout.metadata.describe().items()})
    if not rollout.connected:
        trainer.worse(ERROR if rollout.connections == 0 else WARN, "not connected")
    control = Entry(f"{prefix}: control")
    loop_rate = mode.loop_rate.rate(now_ns * 1e-9)
    step_rates = mode.step_rates_hz(now_ns)
    paused = robot.paused
    control.values = {
        "mode": config.control.mode,
        "target rate Hz": "-" if mode.lockstep else f"{config.control.rate_hz:g}",
        "env step rate Hz": f"{sum(step_rates) / len(step_rates):.1f}",  # per env, averaged over the envs
        "loop rate Hz": f"{loop_rate:.1f}",
        "paused": str(paused),
    }
    if waiting_for_clock:
        control.worse(WARN, "waiting for /clock (use_sim_time is true and no clock message has come)")
    elif paused:
        control.worse(WARN, "paused")
    elif not mode.lockstep and loop_rate and loop_rate < 0.9 * config.control.rate_hz:
        control.worse(WARN, f"control loop at {loop_rate:.1f} Hz, below {config.control.rate_hz:g} Hz")
    entries = [trainer, control]
    for io in robot.envs:
        env = rollout.envs[io.index]
        entry = Entry(f"{prefix}: env {io.index} ({io.namespace or 'no namespace'})")
        level, message = env_state(io, env, mode, paused, now_ns)
        entry.worse(level, message) if level != OK else None
        entry.message = message
        entry.values = {
            "step rate Hz": f"{step_rates[io.index]:.1f}",
            "episodes": str(env.episodes),
            "last return": "-" if env.last_return is None else f"{env.last_return:.3f}",
            "steps": str(env.steps_total),
            "chunks lost": str(env.chunks_lost),
            "reset failures": str(io.reset.total_failures),
            "non-finite actions": str(io.nonfinite_actions),
        }
        entries.append(entry)
    return entries


def recording_entry(prefix: str, status: RecorderStatus) -> Entry:
    """The recorder's state: what it wrote, what it dropped (the writer fell behind), and why it stopped."""
    entry = Entry(f"{prefix}: recording")
    entry.values = {
        "state": status.state.value,
        "accepted": str(status.accepted),
        "dropped": str(status.dropped),
        "dropped with images": str(status.dropped_large),
        "written": str(status.written),
        "files": " ".join(str(path) for path in status.files) or "-",
    }
    if status.state is RecorderState.FAILED:
        entry.worse(ERROR, f"recording stopped: {status.error}")
    elif status.dropped:
        entry.worse(WARN, f"{status.dropped} record(s) dropped: the writer fell behind")
    return entry
