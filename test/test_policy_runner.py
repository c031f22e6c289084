"""Deploy stepping: request-ahead, latency alignment, switch / ensemble / crossfade / sync, idling, counters.

A deterministic simulation of timer-mode stepping (a fake clock, a policy
server with a latency function) drives :class:`PolicyRunner` tick by tick.
The server's actions say where they came from (the test policy server's
encoding: row ``k`` of chunk ``n`` for an observation captured at tick ``s``
is ``[n, k, s, s + k]``), so every applied action can be traced back.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import numpy as np
import pytest

from plugrl_ros.policy.execution import ExecutionSettings, crossfade, ensemble_weights
from plugrl_ros.policy.runner import PolicyRunner
from plugrl_ros.tools.test_policy_server import decode_row, encoded_chunk

PERIOD = 0.02  # 50 Hz


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Sim:
    """Ticks every PERIOD; an answer arrives ``latency()`` after its request and is taken before the next tick."""

    def __init__(self, settings: ExecutionSettings, horizon: int, latency: Callable[[int], float]) -> None:
        self.clock = Clock()
        self.runner = PolicyRunner(settings, PERIOD, self.clock)
        self.runner.on_connected()
        self.horizon = horizon
        self.latency = latency
        self.in_flight: list[tuple[float, int, np.ndarray]] = []
        self.applied: list[tuple[int, np.ndarray | None]] = []  # (tick, action)
        self.arrivals: list[tuple[int, int, np.ndarray]] = []  # (first tick it could apply at, obs tick, actions)
        self.outcomes: list[str] = []
        self.served = 0

    def run(self, ticks: int) -> None:
        start = len(self.applied)
        for i in range(start, start + ticks):
            now = i * PERIOD
            for arrival, number, actions in sorted(a for a in self.in_flight if a[0] <= now):
                self.clock.now = arrival
                self.outcomes.append(self.runner.on_chunk(number, actions))
                self.arrivals.append((i, int(actions[0, 2]), actions))
            self.in_flight = [a for a in self.in_flight if a[0] > now]
            self.clock.now = now
            action = self.runner.step()
            assert self.runner.tick == i
            self.applied.append((i, action))
            if self.runner.wants_request():
                number = self.runner.requested()
                actions = encoded_chunk(number, float(self.runner.tick), self.horizon, 4).astype(np.float64)
                self.in_flight.append((now + self.latency(number), number, actions))

    def actions(self) -> list[tuple[int, np.ndarray]]:
        return [(t, a) for t, a in self.applied if a is not None]


def jittered(base_s: float, jitter_s: float, seed: int = 0) -> Callable[[int], float]:
    rng = random.Random(seed)
    return lambda number: base_s + rng.uniform(0.0, jitter_s)


@pytest.mark.parametrize("mode", ["switch", "ensemble", "crossfade"])
@pytest.mark.parametrize(("latency_s", "horizon"), [(0.0, 10), (0.06, 10), (0.15, 20)])
def test_no_idle_step_at_any_boundary_when_the_server_keeps_up(mode, latency_s, horizon):
    sim = Sim(ExecutionSettings(mode=mode), horizon, jittered(latency_s, 0.01))
    sim.run(60 * horizon)
    stats = sim.runner.stats()
    assert stats.chunks >= 50
    assert stats.idle_steps == 0
    # only the wait for the very first chunk idles: its latency, in ticks
    assert stats.waiting_steps == math.ceil((sim.arrivals[0][0] * PERIOD) / PERIOD)
    assert all(a is not None for _, a in sim.applied[stats.waiting_steps :])


@pytest.mark.parametrize(("latency_s", "horizon"), [(0.0, 10), (0.06, 10), (0.15, 20)])
def test_switch_applies_at_every_tick_the_row_computed_for_that_tick(latency_s, horizon):
    sim = Sim(ExecutionSettings(mode="switch"), horizon, jittered(latency_s, 0.01, seed=3))
    sim.run(40 * horizon)
    applied = sim.actions()
    assert len(applied) > 30 * horizon
    for tick, action in applied:
        number, index, stamp = decode_row(action)
        assert stamp + index == tick, (tick, number, index, stamp)
        assert action[3] == tick
    if latency_s > 0:
        # a late chunk starts past its first rows: nothing is replayed from row 0
        assert all(decode_row(a)[1] > 0 for _, a in applied)


def test_sync_runs_whole_chunks_from_row_0_and_idles_for_the_latency_between_them():
    latency_s, horizon = 0.05, 8  # 2.5 ticks: the answer is taken before the third tick after the request
    sim = Sim(ExecutionSettings(mode="sync"), horizon, lambda n: latency_s)
    sim.run(20 * (horizon + 2))
    pattern = "".join("a" if a is not None else "." for _, a in sim.applied)
    first = pattern.index("a")
    assert first == 3  # the request at tick 0 is answered before tick 3
    body = pattern[first:]
    runs = body.rstrip(".").split("a" * horizon)
    # whole chunks separated by exactly two idle ticks each
    assert set(runs[1:-1]) == {".."}, pattern
    rows = [decode_row(a)[1] for _, a in sim.actions()]
    assert rows[: 2 * horizon] == list(range(horizon)) * 2
    stats = sim.runner.stats()
    assert stats.idle_steps == 2 * (stats.chunks - 1) + (len(body) - len(body.rstrip(".")))
    # the same server, asynchronously: no idle step at all
    asynchronous = Sim(ExecutionSettings(mode="switch"), horizon, lambda n: latency_s)
    asynchronous.run(20 * (horizon + 2))
    assert asynchronous.runner.stats().idle_steps == 0


def test_ensemble_is_the_documented_weighted_average_of_every_live_prediction():
    horizon, rate = 10, 0.5
    settings = ExecutionSettings(mode="ensemble", ensemble_rate=rate, request_ahead_steps=horizon - 1)
    sim = Sim(settings, horizon, jittered(0.03, 0.03, seed=7))
    sim.run(300)
    overlaps = 0
    for tick, action in sim.applied:
        # independently: every chunk taken by this tick that has a row for it, oldest observation first
        live = sorted((s, a) for t0, s, a in sim.arrivals if t0 <= tick and s <= tick <= s + horizon - 1)
        if not live:
            assert action is None
            continue
        rows = np.stack([a[tick - s] for s, a in live])
        weights = np.exp(-rate * np.arange(len(rows)))
        expected = (weights[:, None] * rows).sum(axis=0) / weights.sum()
        np.testing.assert_allclose(action, expected, rtol=1e-12)
        overlaps += len(live) > 2
    assert overlaps > 100  # the test saw real ensembles, not single chunks


def test_ensemble_weights_favour_the_oldest_prediction_for_a_positive_rate():
    w = ensemble_weights(3, 0.01)
    assert w[0] > w[1] > w[2] and math.isclose(w.sum(), 1.0)
    assert np.allclose(ensemble_weights(4, 0.0), 0.25)
    assert ensemble_weights(2, -1.0)[1] > ensemble_weights(2, -1.0)[0]


def test_crossfade_moves_linearly_from_the_old_chunk_to_the_new_over_k_steps():
    clock = Clock()
    runner = PolicyRunner(ExecutionSettings(mode="crossfade", crossfade_steps=4, request_ahead_steps=6), PERIOD, clock)
    runner.on_connected()
    runner.step()
    old = runner.requested()
    assert runner.on_chunk(old, np.zeros((10, 1))) == "applied"
    assert [runner.step()[0] for _ in range(3)] == [0.0, 0.0, 0.0]  # ticks 1..3
    assert runner.wants_request()  # 6 steps left
    new = runner.requested()  # observation of tick 3
    runner.step()  # tick 4, still the old chunk
    assert runner.on_chunk(new, np.ones((10, 1))) == "applied"
    faded = [runner.step()[0] for _ in range(6)]  # ticks 5..10
    assert faded == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert crossfade(np.array([2.0]), np.array([4.0]), 0, 1)[0] == 4.0  # one step: a plain switch


def test_a_chunk_that_arrives_after_its_last_tick_is_dropped_never_replayed():
    horizon = 5
    # the first answer takes 8 ticks: every row is for a tick already past
    sim = Sim(ExecutionSettings(mode="switch"), horizon, lambda n: 0.16 if n == 0 else 0.01)
    sim.run(100)
    assert sim.outcomes[0] == "stale"
    stats = sim.runner.stats()
    assert stats.stale_dropped == 1
    assert all(decode_row(a)[0] != 0 for _, a in sim.actions())
    assert all(decode_row(a)[2] + decode_row(a)[1] == t for t, a in sim.actions())


def test_a_latency_spike_idles_the_robot_instead_of_extrapolating_and_counts_it():
    horizon = 10
    sim = Sim(ExecutionSettings(mode="switch"), horizon, lambda n: 0.5 if n == 10 else 0.03)
    sim.run(200)
    stats = sim.runner.stats()
    assert stats.idle_steps > 0
    # every tick without a row meant for it idled: no action was reused or extended
    for tick, action in sim.applied:
        if action is not None:
            assert decode_row(action)[2] + decode_row(action)[1] == tick
    assert sum(a is None for _, a in sim.applied) == stats.idle_steps + stats.waiting_steps


def test_request_ahead_follows_the_measured_latency_or_the_fixed_setting():
    runner = PolicyRunner(ExecutionSettings(initial_latency_s=0.1), PERIOD, Clock())
    assert runner.request_ahead() == 5 + 1
    sim = Sim(ExecutionSettings(), 20, lambda n: 0.13)
    sim.run(100)
    assert sim.runner.request_ahead() == math.ceil(0.13 / PERIOD) + 1
    fixed = Sim(ExecutionSettings(request_ahead_steps=2), 20, lambda n: 0.01)
    fixed.run(100)
    assert fixed.runner.request_ahead() == 2
    # every request after the first went out with exactly 2 steps left of the newest chunk
    firsts = [t for t, s, _ in fixed.arrivals]
    obs_ticks = [s for _, s, _ in fixed.arrivals]
    assert all(s == prev + 19 - 2 for prev, s in itertools.pairwise(obs_ticks)), (firsts, obs_ticks)


def test_losing_the_link_idles_at_the_next_tick_and_a_late_answer_is_ignored():
    clock = Clock()
    runner = PolicyRunner(ExecutionSettings(), PERIOD, clock)
    assert not runner.wants_request()  # not connected
    runner.on_connected()
    runner.step()
    first = runner.requested()
    runner.on_chunk(first, np.ones((10, 2)))
    assert runner.step() is not None
    second = runner.requested()
    runner.on_link_lost()
    assert runner.step() is None
    assert runner.on_chunk(second, np.ones((10, 2))) == "unknown"
    assert runner.step() is None
    assert not runner.wants_request()
    runner.on_connected()
    assert runner.wants_request()
    stats = runner.stats()
    assert stats.idle_steps == 0 and stats.waiting_steps == 3  # tick 0, and the two after the loss


def test_an_overdue_request_is_abandoned_and_its_answer_ignored():
    clock = Clock()
    runner = PolicyRunner(ExecutionSettings(max_latency_s=1.0, first_answer_s=1.0), PERIOD, clock)
    runner.on_connected()
    runner.step()
    number = runner.requested()
    clock.now = 0.9
    assert not runner.request_overdue()
    clock.now = 1.1
    assert runner.request_overdue()
    runner.abandon()
    assert runner.on_chunk(number, np.ones((3, 1))) == "unknown"
    assert runner.stats().abandoned == 1
    assert runner.wants_request()


def test_a_connection_s_first_answer_has_its_own_bound_and_later_ones_the_steady_bound():
    clock = Clock()
    runner = PolicyRunner(ExecutionSettings(max_latency_s=1.0, first_answer_s=30.0), PERIOD, clock)
    for _ in range(2):  # on every connection: the first answer may be slow (a model compiling)
        runner.on_connected()
        runner.step()
        assert runner.answer_bound() == (30.0, "latency.first_answer_s")
        number = runner.requested()
        clock.now += 20.0
        assert not runner.request_overdue()
        assert runner.on_chunk(number, np.ones((3, 1))) == "applied"
        assert runner.answer_bound() == (1.0, "latency.max_s")
        runner.step()
        runner.requested()
        clock.now += 1.1
        assert runner.request_overdue()
        runner.abandon()
        runner.on_link_lost()


def test_a_rejected_answer_frees_the_request_and_runs_nothing():
    runner = PolicyRunner(ExecutionSettings(), PERIOD, Clock())
    runner.on_connected()
    runner.step()
    number = runner.requested()
    assert not runner.wants_request()
    runner.on_rejected(number)
    assert runner.step() is None
    assert runner.wants_request()
    assert runner.stats().rejected == 1


def test_statistics_report_latency_percentiles_and_the_achieved_step_rate():
    latencies = [0.01, 0.02, 0.03, 0.04, 0.05] * 20
    sim = Sim(ExecutionSettings(mode="switch", latency_window=100), 10, lambda n: latencies[n % len(latencies)])
    sim.run(500)
    stats = sim.runner.stats()
    assert stats.latency_median_s == pytest.approx(0.03)
    assert stats.latency_p95_s == pytest.approx(0.05)
    assert stats.step_rate_hz == pytest.approx(1 / PERIOD)
    assert stats.requests == stats.chunks + (1 if sim.in_flight else 0)
    assert stats.steps + stats.idle_steps + stats.waiting_steps == 500


def test_statistics_render_for_diagnostics_and_the_status_line():
    sim = Sim(ExecutionSettings(mode="switch"), 10, lambda n: 0.03)
    sim.run(200)
    stats = sim.runner.stats()
    values = stats.values()
    assert values["request latency median ms"] == "30.0" and values["idle steps at boundaries"] == "0"
    assert values["step rate Hz"] == "50.0"
    assert stats.summary().startswith("50 steps/s, latency 30.0/30.0 ms (median/p95), 0 idle at boundaries")
    fresh = PolicyRunner(ExecutionSettings(), PERIOD, Clock()).stats()
    assert fresh.values()["request latency p95 ms"] == "-" and fresh.summary().startswith("- steps/s")


def test_after_a_hold_nothing_planned_before_it_runs():
    clock = Clock()
    runner = PolicyRunner(ExecutionSettings(request_ahead_steps=8), PERIOD, clock)
    runner.on_connected()
    runner.step()
    runner.on_chunk(runner.requested(), np.ones((10, 1)))
    assert runner.step() is not None
    assert runner.wants_request()
    in_flight = runner.requested()
    runner.hold()  # paused: no ticks for a while
    assert runner.step() is None  # the chunk that was running is gone
    assert not runner.wants_request()  # the connection still has its request out
    assert runner.on_chunk(in_flight, np.ones((10, 1))) == "dropped"
    assert runner.step() is None
    assert runner.wants_request()
    fresh = runner.requested()
    assert runner.on_chunk(fresh, np.full((10, 1), 2.0)) == "applied"
    assert runner.step()[0] == 2.0
    stats = runner.stats()
    assert stats.stale_dropped == 0 and stats.idle_steps == 0  # a hold's idling is not a boundary's
