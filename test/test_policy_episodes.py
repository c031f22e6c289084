"""The pure episode bookkeeping of deploy mode (plugrl_ros/policy/episodes.py)."""

from __future__ import annotations

import pytest

from plugrl_ros.policy.episodes import EpisodeTracker, Phase


def test_an_episode_begins_with_its_first_action_and_ends_on_terminated_with_its_summed_return():
    tracker = EpisodeTracker(max_steps=0, resets=True, reset_on_start=True)
    assert tracker.phase is Phase.RESETTING  # reset before the first episode
    tracker.reset_done()
    assert tracker.phase is Phase.WAITING
    tracker.begin()
    for reward in (1.0, 2.0):
        assert tracker.result(reward, False, False, False) is None
        tracker.stepped()
    end = tracker.result(4.0, True, False, True)
    assert end is not None and (end.ret, end.length, end.success, end.terminated) == (7.0, 3, True, True)
    assert tracker.phase is Phase.RESETTING
    assert (tracker.episodes, tracker.successes, tracker.mean_return()) == (1, 1, 7.0)


def test_max_steps_truncates_after_the_last_steps_result_and_no_reset_means_waiting_again():
    tracker = EpisodeTracker(max_steps=2, resets=False, reset_on_start=True)
    assert tracker.phase is Phase.WAITING  # reset.mode none: nothing to reset
    tracker.begin()
    assert tracker.result(1.0, False, False, False) is None
    tracker.stepped()
    end = tracker.result(0.5, False, False, False)
    assert end is not None and (end.ret, end.length, end.terminated) == (1.5, 2, False)
    assert tracker.phase is Phase.WAITING


def test_a_pause_truncates_only_a_running_episode_and_the_means_cover_every_episode():
    tracker = EpisodeTracker(max_steps=0, resets=True, reset_on_start=False)
    assert tracker.truncate(1.0, False) is None  # nothing runs yet
    returns = []
    for ret in (1.0, 3.0, -1.0):
        tracker.begin()
        end = tracker.truncate(ret, False)
        assert end is not None and not end.terminated
        returns.append(end.ret)
        tracker.reset_done()
    assert tracker.mean_return() == pytest.approx(1.0) and tracker.recent_mean_return() == pytest.approx(1.0)
    assert tracker.last is not None and tracker.last.ret == -1.0
