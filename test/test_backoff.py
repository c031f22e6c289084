"""The one retry-delay rule: reconnects (with jitter) and a robot's reset service (without)."""

from __future__ import annotations

import random

from plugrl_ros.protocol.backoff import Backoff


def test_without_jitter_the_delay_doubles_from_the_initial_up_to_the_bound_and_a_reset_starts_over():
    backoff = Backoff(0.5, 3.0, jitter=False)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next_delay() == 0.5


def test_with_jitter_each_delay_lies_between_half_its_base_and_its_base():
    backoff = Backoff(1.0, 8.0, rng=random.Random(7))
    for base in (1.0, 2.0, 4.0, 8.0, 8.0):
        assert base / 2 <= backoff.next_delay() <= base
