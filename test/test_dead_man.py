"""The dead-man switch's rules, on a fake clock."""

from __future__ import annotations

import pytest

from plugrl_ros.robot.dead_man import DeadManSwitch

MAX_AGE = 0.2
PERIOD = 0.05  # a switch publishing "run" at 20 Hz


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def held_switch() -> tuple[DeadManSwitch, Clock]:
    """A switch the operator is holding: the robots run."""
    clock = Clock()
    switch = DeadManSwitch(MAX_AGE, clock)
    switch.heard(pause=False)
    clock.advance(PERIOD)
    assert switch.heard(pause=False) == "said run again"
    return switch, clock


def test_the_robots_are_held_until_the_switch_says_run_twice_a_publish_period_apart():
    clock = Clock()
    switch = DeadManSwitch(MAX_AGE, clock)
    assert switch.stopping and switch.expired() is None
    assert switch.heard(pause=False) is None and switch.stopping  # one message could be an old one
    clock.advance(PERIOD)
    assert switch.heard(pause=False) == "said run again" and not switch.stopping


def test_run_messages_keep_the_robots_running_and_silence_holds_them_after_max_age():
    switch, clock = held_switch()
    for _ in range(20):
        clock.advance(PERIOD)
        assert switch.heard(pause=False) is None and switch.expired() is None
    clock.advance(MAX_AGE - 0.001)
    assert switch.expired() is None  # just within max_age: still fresh
    clock.advance(0.002)
    assert switch.expired() == "went silent" and switch.stopping
    assert switch.expired() is None  # said once


def test_pause_holds_the_robots_at_once_and_resuming_needs_two_runs_again():
    switch, clock = held_switch()
    assert switch.heard(pause=True) == "said pause" and switch.stopping
    clock.advance(PERIOD)
    assert switch.heard(pause=False) is None and switch.stopping
    clock.advance(PERIOD)
    assert switch.heard(pause=False) == "said run again"


def test_a_run_handled_after_the_deadline_does_not_extend_it():
    switch, clock = held_switch()
    clock.advance(1.0)  # the bridge stalled; nothing was handled meanwhile
    assert switch.heard(pause=False) == "went silent" and switch.stopping


@pytest.mark.parametrize("gap", [0.0, 0.001, 0.019])
def test_a_burst_of_queued_runs_does_not_resume(gap):
    switch, clock = held_switch()
    clock.advance(1.0)
    switch.expired()
    for _ in range(10):  # the backlog, delivered at once
        assert switch.heard(pause=False) is None
        clock.advance(gap)
    assert switch.stopping


def test_two_runs_further_apart_than_max_age_do_not_resume_but_the_next_one_in_time_does():
    clock = Clock()
    switch = DeadManSwitch(MAX_AGE, clock)
    switch.heard(pause=False)
    clock.advance(MAX_AGE + 0.1)
    assert switch.heard(pause=False) is None and switch.stopping  # a new first of two
    clock.advance(PERIOD)
    assert switch.heard(pause=False) == "said run again"


def test_a_pause_between_two_runs_starts_the_pair_over():
    clock = Clock()
    switch = DeadManSwitch(MAX_AGE, clock)
    switch.heard(pause=False)
    clock.advance(PERIOD)
    switch.heard(pause=True)
    clock.advance(PERIOD)
    assert switch.heard(pause=False) is None and switch.stopping


def test_a_short_max_age_shortens_the_resume_gap_so_it_can_resume_at_all():
    clock = Clock()
    switch = DeadManSwitch(0.01, clock)
    switch.heard(pause=False)
    clock.advance(0.006)
    assert switch.heard(pause=False) == "said run again"


def test_max_age_must_be_positive():
    with pytest.raises(ValueError, match="max_age_s > 0"):
        DeadManSwitch(0.0, Clock())
