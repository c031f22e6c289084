"""The silent-robot watch, driven by hand: when it warns, when it resets again, how it backs off, when it lets go."""

from __future__ import annotations

from plugrl_ros.protocol.backoff import Backoff
from plugrl_ros.robot.silence import REPEATED_RESETS, SilenceWatch, Verdict

SILENT = ["robot/state (nothing new since the reset)"]


def watch(can_reset: bool = True) -> SilenceWatch:
    return SilenceWatch(Backoff(0.2, 1.0, jitter=False), can_reset=can_reset)


def test_a_silence_shorter_than_the_limit_is_quiet():
    w = watch()
    assert w.check(0.0, SILENT, 1.0, movable=True) is Verdict.QUIET
    assert w.check(0.99, SILENT, 1.0, movable=True) is Verdict.QUIET
    assert w.problem(0.99) == ""


def test_a_silence_past_the_limit_warns_once_then_resets_after_the_backoff_delay():
    w = watch()
    w.check(0.0, SILENT, 1.0, movable=True)
    assert w.check(1.0, SILENT, 1.0, movable=True) is Verdict.WARN
    assert "robot/state (nothing new since the reset)" in w.problem(1.0)
    assert w.check(1.1, SILENT, 1.0, movable=True) is Verdict.QUIET  # the first delay is 0.2 s
    assert w.check(1.2, SILENT, 1.0, movable=True) is Verdict.RESET
    assert w.resets == 1


def test_resets_for_one_silence_back_off_and_turn_to_an_error_when_they_do_not_help():
    w = watch()
    now, delays = 0.0, []
    w.check(now, SILENT, 1.0, movable=True)
    for _ in range(REPEATED_RESETS):
        now += 1.0
        assert w.check(now, SILENT, 1.0, movable=True) is Verdict.WARN
        assert w.retry_at_s is not None
        delays.append(round(w.retry_at_s - now, 3))
        assert w.check(w.retry_at_s - 0.01, SILENT, 1.0, movable=True) is Verdict.QUIET
        now = w.retry_at_s
        assert w.check(now, SILENT, 1.0, movable=True) is Verdict.RESET
        w.restart(now)  # the reset completed; the robot gets a new limit to answer it
    assert delays == [0.2, 0.4, 0.8]
    assert w.repeated and "reset 3x for it" in w.problem(now)


def test_an_env_that_has_moved_is_reported_but_never_reset():
    w = watch()
    w.check(0.0, SILENT, 1.0, movable=False)
    assert w.check(1.0, SILENT, 1.0, movable=False) is Verdict.WARN
    assert all(w.check(1.0 + k, SILENT, 1.0, movable=False) is Verdict.QUIET for k in range(1, 20))
    assert w.resets == 0


def test_without_a_reset_procedure_the_silence_is_reported_as_unrecoverable():
    w = watch(can_reset=False)
    w.check(0.0, SILENT, 1.0, movable=True)
    assert w.check(1.0, SILENT, 1.0, movable=True) is Verdict.WARN
    assert w.check(30.0, SILENT, 1.0, movable=True) is Verdict.QUIET
    assert "no reset is configured" in w.problem(30.0)


def test_a_fresh_observation_ends_the_silence_and_restores_the_backoff():
    w = watch()
    w.check(0.0, SILENT, 1.0, movable=True)
    w.check(1.0, SILENT, 1.0, movable=True)
    assert w.check(1.2, SILENT, 1.0, movable=True) is Verdict.RESET
    w.restart(1.3)
    assert w.problem(1.4)  # still reported while the robot has not answered
    assert w.check(1.5, [], 1.0, movable=True) is Verdict.HEARD
    assert w.problem(1.5) == "" and w.resets == 0
    assert w.check(1.6, [], 1.0, movable=True) is Verdict.QUIET
    # a later silence starts from the first delay again
    w.check(2.0, SILENT, 1.0, movable=True)
    w.check(3.0, SILENT, 1.0, movable=True)
    assert w.check(3.2, SILENT, 1.0, movable=True) is Verdict.RESET


def test_a_limit_of_zero_never_judges_an_env_silent():
    w = watch()
    assert all(w.check(float(t), SILENT, 0.0, movable=True) is Verdict.QUIET for t in range(100))
