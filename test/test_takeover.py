"""The takeover rule of human-in-the-loop interventions, on a fake clock."""

from __future__ import annotations

import pytest

from plugrl_ros.robot.takeover import Control, Takeover

# takeover reads its rule names from the parameter declarations, which build rcl descriptors
pytestmark = pytest.mark.ros

MAX_AGE = 0.2
PERIOD = 0.05  # a device publishing at 20 Hz


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def joy(takeover: Takeover, held: bool) -> None:
    """A Joy message: its axes are the command, its button the deadman."""
    takeover.commanded()
    takeover.deadman(held)


@pytest.mark.parametrize("rule", ["button", "topic"])
def test_the_policy_commands_until_the_deadman_is_held_and_the_person_while_it_is(rule):
    clock = Clock()
    takeover = Takeover(rule, MAX_AGE, clock)
    assert takeover.control() is Control.POLICY  # nothing heard: nobody holds it
    joy(takeover, held=False)
    assert takeover.control() is Control.POLICY  # commands without the deadman do not take over
    for _ in range(10):
        clock.advance(PERIOD)
        joy(takeover, held=True)
        assert takeover.control() is Control.PERSON
    clock.advance(PERIOD)
    joy(takeover, held=False)
    assert takeover.control() is Control.POLICY


@pytest.mark.parametrize("rule", ["button", "topic"])
def test_a_device_silent_while_its_deadman_is_held_leaves_the_robot_to_nobody_never_the_policy(rule):
    clock = Clock()
    takeover = Takeover(rule, MAX_AGE, clock)
    joy(takeover, held=True)
    clock.advance(MAX_AGE - 0.001)
    assert takeover.control() is Control.PERSON  # just within max_age
    clock.advance(0.002)
    assert takeover.control() is Control.SILENT
    clock.advance(3600.0)
    assert takeover.control() is Control.SILENT  # however long the silence lasts
    joy(takeover, held=True)
    assert takeover.control() is Control.PERSON  # the device is back, still held
    clock.advance(1.0)
    joy(takeover, held=False)
    assert takeover.control() is Control.POLICY  # let go: only now may the policy command


def test_a_held_deadman_without_a_fresh_command_is_silent():
    """A Bool deadman held while the command topic (a leader arm, a teleop node) says nothing: idle."""
    clock = Clock()
    takeover = Takeover("topic", MAX_AGE, clock)
    takeover.deadman(True)
    assert takeover.control() is Control.SILENT  # never a command
    takeover.commanded()
    assert takeover.control() is Control.PERSON
    for _ in range(6):  # the deadman keeps saying held; the command stops
        clock.advance(PERIOD)
        takeover.deadman(True)
    assert takeover.control() is Control.SILENT


def test_a_deadman_that_stops_repeating_held_is_silent_even_while_commands_come():
    clock = Clock()
    takeover = Takeover("topic", MAX_AGE, clock)
    takeover.deadman(True)
    for _ in range(6):
        clock.advance(PERIOD)
        takeover.commanded()
    assert takeover.control() is Control.SILENT


def test_the_fresh_rule_takes_over_while_commands_are_fresh_and_gives_back_when_they_stop():
    clock = Clock()
    takeover = Takeover("fresh", MAX_AGE, clock)
    assert takeover.control() is Control.POLICY
    takeover.commanded()
    assert takeover.control() is Control.PERSON
    takeover.deadman(True)  # the fresh rule has no deadman
    clock.advance(MAX_AGE + 0.001)
    assert takeover.control() is Control.POLICY


@pytest.mark.parametrize(("rule", "max_age"), [("pedal", 0.2), ("button", 0.0), ("fresh", -1.0)])
def test_a_bad_rule_or_age_is_refused(rule, max_age):
    with pytest.raises(ValueError):
        Takeover(rule, max_age, Clock())
