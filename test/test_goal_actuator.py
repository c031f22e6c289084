"""Tests for plugrl_ros.robot.goal_actuator's gate: the rate limit and the running-goal rule (clock given)."""

from __future__ import annotations

import pytest

from plugrl_ros.robot.goal_actuator import GoalGate


def sent_at(gate: GoalGate, times: list[float], running: bool = False) -> list[float]:
    out = []
    for now in times:
        if gate.admits(now, running):
            gate.sent(now)
            out.append(now)
    return out


def test_without_a_period_every_step_is_a_goal():
    assert sent_at(GoalGate("replace", 0.0, 0.02), [0.0, 0.02, 0.04]) == [0.0, 0.02, 0.04]


def test_a_goal_period_lets_one_goal_through_per_period_and_the_steps_between_send_none():
    times = [round(0.02 * i, 2) for i in range(26)]  # 50 Hz for half a second
    assert sent_at(GoalGate("replace", 0.1, 0.02), times) == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]


def test_a_tick_a_little_early_still_lets_the_goal_through():
    # ticks jitter: 5 ticks of 20 ms that took 99 ms are a goal period of 0.1 s
    assert sent_at(GoalGate("replace", 0.1, 0.02), [0.0, 0.099, 0.185]) == [0.0, 0.099]


@pytest.mark.parametrize(("rule", "admitted"), [("replace", True), ("skip", False)])
def test_while_a_goal_runs_a_step_replaces_it_or_is_skipped(rule, admitted):
    gate = GoalGate(rule, 0.0, 0.02)
    assert gate.admits(1.0, running=True) is admitted
    assert gate.admits(1.0, running=False), "with no goal running, either rule sends"
