"""The demo's scripted person at a gamepad: when they hold the deadman, and where they steer."""

from __future__ import annotations

import numpy as np

from plugrl_ros.demo.scripted_person import PersonSettings, ScriptedPerson


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def far(dq=(0.5, -0.2)) -> np.ndarray:
    return np.array([0.3, 0.0, *dq])


def test_the_person_takes_over_after_the_arm_strays_for_their_patience_and_lets_go_close_to_the_target():
    clock = Clock()
    person = ScriptedPerson(PersonSettings(patience_s=1.0), clock)
    for _ in range(10):  # 0.9 s far from the target: the policy still has its chance
        person.see(far())
        assert not person.held
        clock.now += 0.1
    person.see(far())
    assert person.held and person.takeovers == 1
    person.see(np.array([0.05, 0.0, 0.1, 0.0]))  # closer, not yet within release_m
    assert person.held
    person.see(np.array([0.01, 0.0, 0.02, 0.0]))
    assert not person.held


def test_coming_back_near_the_target_restarts_the_patience():
    clock = Clock()
    person = ScriptedPerson(PersonSettings(patience_s=1.0), clock)
    person.see(far())
    clock.now += 0.8
    person.see(np.array([0.1, 0.0, 0.1, 0.1]))  # within stray_m
    clock.now += 0.5
    person.see(far())
    assert not person.held


def test_the_person_helps_only_during_the_first_minutes():
    clock = Clock()
    person = ScriptedPerson(PersonSettings(patience_s=0.0, helping_s=60.0), clock)
    person.see(far())
    assert person.held
    clock.now += 61.0
    person.see(far())
    assert not person.held  # let go at the end of the helping time, even far away
    person.see(far())
    assert not person.held and person.takeovers == 1


def test_the_stick_steers_the_joints_toward_the_target_within_full_deflection():
    person = ScriptedPerson(PersonSettings(gain=3.0, max_speed=2.0), Clock())
    person.see(np.array([0.3, 0.0, 0.2, -2.0]))
    assert np.allclose(person.stick(), [0.3, -1.0])
