"""The bridge's periodic one-line status in the log: link, rate, steps, episodes, returns, stale envs."""

from __future__ import annotations

from rclpy.clock import Clock

from plugrl_ros.node.diagnostics import percentile_ms
from plugrl_ros.robot.robot_side import RobotSide
from plugrl_ros.train.train_mode import TrainMode

WAITING_FOR_CLOCK = (
    "waiting for /clock: use_sim_time is true and no clock message has come, so the control loop "
    "has not started (start the simulator, or set use_sim_time:=false)"
)


def waiting_for_clock(clock: Clock) -> bool:
    """use_sim_time is on and no /clock message has come yet: simulated time has not started."""
    return bool(getattr(clock, "ros_time_is_active", False)) and clock.now().nanoseconds == 0


def status_line(robot: RobotSide, mode: TrainMode) -> str:
    """The periodic status line (when simulated time runs; see :data:`WAITING_FOR_CLOCK`)."""
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
        + (" | PAUSED" if robot.paused else "")
    )
