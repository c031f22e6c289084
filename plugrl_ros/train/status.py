"""What train mode reports: the trainer link, the control loop and each env on /diagnostics, and a status line."""

from __future__ import annotations

import time
from typing import Protocol

from plugrl_ros.robot.robot_side import RobotSide
from plugrl_ros.robot.status import ERROR, OK, WARN, Entry, env_condition, percentile_ms, person_values, share
from plugrl_ros.rollout.env_rollout import EnvRollout
from plugrl_ros.rollout.rollout import Rollout
from plugrl_ros.ros.config import BridgeConfig
from plugrl_ros.train.rates import RateMeter
from plugrl_ros.train.trainer_link import TrainerLink


class TrainMode(Protocol):
    """What the reports read of train mode (:class:`plugrl_ros.train.train_mode.TrainMode`, which imports this)."""

    config: BridgeConfig
    robot: RobotSide
    rollout: Rollout
    link: TrainerLink
    lockstep: bool
    loop_rate: RateMeter
    last_close: str
    reconnects: int
    config_problem: str

    def step_rates_hz(self, now_ns: int) -> list[float]: ...


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


def env_state(mode: TrainMode, env: EnvRollout, now_ns: int) -> tuple[bytes, str]:
    """One env's level and a sentence on what it is doing (or what keeps it from stepping)."""
    io = mode.robot.envs[env.index]
    condition = env_condition(io, mode.robot.paused, now_ns, time.monotonic())
    if condition is not None:
        return condition
    if env.chunk is not None:
        waited = time.monotonic() - io.step_sent_s
        if env.step_in_flight and waited > max(1.0, 0.5 * mode.config.control.env_timeout_s):
            waiting = ", ".join(io.step_waiting_for()) or "its step result"
            return WARN, f"step result overdue ({waited:.1f} s): waiting for {waiting}"
        return OK, "running"
    if env.pending is not None:
        return OK, "chunk done, feedback queued"
    return OK, "waiting for the trainer" if mode.rollout.connected else "waiting for the trainer connection"


def train_diagnostics(prefix: str, mode: TrainMode, uplink: UplinkMeter) -> list[Entry]:
    """The trainer link, the control loop, and one entry per env."""
    config = mode.config
    robot: RobotSide = mode.robot
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
        "metadata received": str(rollout.metadata is not None),
    }
    if rollout.metadata is not None:
        trainer.values.update({f"trainer {k}": v for k, v in rollout.metadata.describe().items()})
    if mode.config_problem:
        trainer.worse(ERROR, mode.config_problem)
    elif not rollout.connected:
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
    if robot.waiting_for_clock():
        control.worse(WARN, "waiting for /clock (use_sim_time is true and no clock message has come)")
    elif paused:
        control.worse(WARN, "paused")
    elif not mode.lockstep and loop_rate and loop_rate < 0.9 * config.control.rate_hz:
        control.worse(WARN, f"control loop at {loop_rate:.1f} Hz, below {config.control.rate_hz:g} Hz")
    entries = [trainer, control]
    for io in robot.envs:
        env = rollout.envs[io.index]
        entry = Entry(f"{prefix}: env {io.index} ({io.namespace or 'no namespace'})")
        level, message = env_state(mode, env, now_ns)
        entry.level, entry.message = level, message
        entry.values = {
            "step rate Hz": f"{step_rates[io.index]:.1f}",
            "episodes": str(env.episodes),
            "last return": "-" if env.last_return is None else f"{env.last_return:.3f}",
            "steps": str(env.steps_total),
            "chunks lost": str(env.chunks_lost),
            "reset failures": str(io.reset.total_failures),
            "resets for silence": str(io.silence.total_resets),
            "non-finite actions": str(io.nonfinite_actions),
        }
        if robot.people is not None:
            entry.values.update(person_values(robot.control(io.index).value, env.person_steps, env.steps_total))
        entries.append(entry)
    return entries


def train_status_line(mode: TrainMode) -> str:
    """The periodic status line: link, each env's step rate, steps, episodes, returns, stale envs."""
    robot = mode.robot
    rollout = mode.rollout
    envs = rollout.envs
    episodes = sum(e.episodes for e in envs)
    returns = [e.last_return for e in envs if e.last_return is not None]
    now_ns = robot.now_ns()
    stale = [io.index for io in robot.envs if io.stale_sources(now_ns)]
    link = f"connected (connection {rollout.connections})" if rollout.connected else "NOT connected"
    rates = mode.step_rates_hz(now_ns)
    shown = " ".join(f"{r:.1f}" for r in rates) if len(rates) <= 8 else f"{min(rates):.1f}..{max(rates):.1f}"
    rate = f" | env steps/s {shown}" + ("" if mode.lockstep else f" (target {mode.config.control.rate_hz:g})")
    ret = f", mean last return {sum(returns) / len(returns):.3f}" if returns else ""
    return (
        f"trainer {link}{rate} | {sum(e.steps_total for e in envs)} steps, {episodes} episodes{ret} | "
        f"infer {percentile_ms(list(rollout.infer_latencies), 0.5)} ms"
        + (f" | stale envs {stale}" if stale else "")
        + (
            " | person share " + " ".join(share(e.person_steps, e.steps_total) for e in envs)
            if robot.people is not None
            else ""
        )
        + (" | PAUSED" if robot.paused else "")
    )
