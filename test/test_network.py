"""The whole deployment across a real, impaired network: latency and jitter, loss, partitions, half-open links.

The probe robot and the bridge run as real ROS processes (``plugrl-probe``);
the test trainer checks every probe clause. Between the bridge and the
trainer is a link the test controls (test/netem.py): a userspace relay for
latency, jitter, partitions and half-open cuts (no privileges needed), and a
pair of network namespaces for packet loss (root, iptables; skipped with the
reason where that cannot run). Policy mode is not wired into the node yet; its
runs across these links come when it is.
"""

from __future__ import annotations

import select
import sys
import tempfile
import time
from pathlib import Path

import pytest
from harness import ROOT, Child, TrainerThread, process, python_module
from netem import NetnsLink, Relay, netns_unavailable

from plugrl_ros.tools.test_trainer import REWARD_SUM, TERMINAL_OBSERVATION, TIME_MAJOR, TrainerSettings

pytestmark = [pytest.mark.ros, pytest.mark.slow, pytest.mark.network, pytest.mark.websockets_incidental]

DEAD_LINK = "no answer from the trainer within"
ANSWER_TIMEOUT_S = 3.0
# tight dead-link bounds, so that a partition is noticed well inside it
BOUNDS = ("--first-answer-timeout", "6", "--answer-timeout", f"{ANSWER_TIMEOUT_S}", "--tcp-timeout", "4")


def trainer_settings(**overrides: object) -> TrainerSettings:
    values: dict = {
        "port": 0,
        "script": ("resync", "stop"),
        "feedbacks_per_connection": 12,
        "metadata_delay_s": 0.0,
        "metadata_padding_bytes": 0,
        "grace_s": 1.0,
        "reconnect_window_s": 60.0,
        "features": ("reuse-feedback-obs",),
    }
    values.update(overrides)
    return TrainerSettings(**values)


def probe_command(uri: str, *args: str) -> list[str]:
    return python_module("plugrl_ros.tools.probe", "--server", uri, "--envs", "2", "--rate", "50", *BOUNDS, *args)


def assert_every_clause_passes(report, output: str, feedbacks: int) -> None:
    assert report.failed == 0, report.text() + output
    assert not report.incomplete, report.text() + output
    for clause in (REWARD_SUM, TERMINAL_OBSERVATION, TIME_MAJOR):
        assert report.clause(clause).passed >= feedbacks, report.text()


def wait_for(child: Child, text: str, timeout: float) -> None:
    """Wait until ``text`` appears in the child's log (the child writes a file: nothing to block on)."""
    deadline = time.monotonic() + timeout
    while text not in child.output():
        assert child.proc.poll() is None, f"the probe exited while we waited for {text!r}:\n{child.output()}"
        assert time.monotonic() < deadline, f"{text!r} did not appear within {timeout:g} s:\n{child.output()}"
        select.select([], [], [], 0.1)


@pytest.fixture
def relayed():
    """``start(settings, **relay_options) -> (trainer, relay)``: a test trainer behind a relay, both stopped after."""
    started: list = []

    def start(settings: TrainerSettings, **relay_options: float):
        trainer = TrainerThread(settings)
        trainer.start()
        relay = Relay("127.0.0.1", trainer.port, **relay_options)
        started.append((trainer, relay))
        relay.start()
        return trainer, relay

    yield start
    for trainer, relay in started:
        relay.stop()
        trainer.end()


@pytest.mark.parametrize("rtt_ms", [50, 150, 300])
def test_every_probe_clause_passes_across_a_delayed_jittery_link(relayed, rtt_ms):
    # ±20% jitter on each chunk's delay; a TCP stream stays in order, so this is also what
    # packet reordering looks like from above TCP (see test/netem.py)
    trainer, relay = relayed(trainer_settings(), rtt_s=rtt_ms / 1000, jitter=0.2)
    with process(probe_command(relay.uri, "--mode", "lockstep")) as probe:
        code = probe.wait(150)
        report = trainer.report(timeout=30)
        output = probe.output()
    assert code == 0, output
    assert_every_clause_passes(report, output, 12)


def test_a_10s_partition_mid_chunk_is_detected_within_the_bound_and_the_bridge_reconnects(relayed):
    # H = 50 at 50 Hz: a chunk runs for a second, so the partition begins in the middle of one.
    trainer, relay = relayed(trainer_settings(horizon=50, feedbacks_per_connection=8))
    with process(probe_command(relay.uri, "--mode", "timer")) as probe:
        assert relay.wait_writes_down(4, 60), probe.output()  # the metadata and three actions
        relay.partition()
        started = time.monotonic()
        wait_for(probe, DEAD_LINK, ANSWER_TIMEOUT_S + 30)  # a chunk, then the bound, on a loaded machine
        detected_after = time.monotonic() - started
        held = probe.output()
        # the scenario's partition lasts 10 s; the bridge keeps trying meanwhile
        time.sleep(max(0.0, 10.0 - detected_after))
        relay.heal()
        code = probe.wait(180)
        report = trainer.report(timeout=30)
        output = probe.output()
    assert "(connection 2)" not in held, held  # nothing got through the partition
    assert "dropped the chunks" in held, held  # the robot stopped the chunk it was in
    assert code == 0, output
    # a feedback held across the partition and sent on the new connection would fail a clause here
    assert_every_clause_passes(report, output, 8)
    assert "(connection 2)" in output, output


def test_a_half_open_link_is_detected_within_the_bound(relayed):
    # The trainer's side vanishes without a FIN reaching the bridge: only the bridge's bound can notice.
    trainer, relay = relayed(trainer_settings(feedbacks_per_connection=8))
    with process(probe_command(relay.uri, "--mode", "lockstep")) as probe:
        assert relay.wait_writes_down(4, 60), probe.output()
        relay.cut_half_open()
        wait_for(probe, DEAD_LINK, ANSWER_TIMEOUT_S + 30)
        code = probe.wait(180)
        report = trainer.report(timeout=30)
        output = probe.output()
    assert code == 0, output
    assert_every_clause_passes(report, output, 8)


@pytest.fixture
def netns():
    why = netns_unavailable()
    if why is not None:
        pytest.skip(why)
    with NetnsLink() as link:
        yield link


@pytest.mark.parametrize("loss", [0.01, 0.05])
def test_every_probe_clause_passes_with_packet_loss(netns, loss):
    netns.loss(loss)
    with netns.in_trainer_ns():
        trainer = TrainerThread(trainer_settings(host=NetnsLink.TRAINER_ADDR))
        trainer.start()
    try:
        uri = f"ws://{NetnsLink.TRAINER_ADDR}:{trainer.port}"
        with process(netns.exec_prefix() + probe_command(uri, "--mode", "lockstep", "--answer-timeout", "30")) as probe:
            code = probe.wait(180)
            report = trainer.report(timeout=30)
            output = probe.output()
    finally:
        trainer.end()
    assert code == 0, output
    assert_every_clause_passes(report, output, 12)


def test_a_partition_longer_than_the_trainers_feedback_timeout_closes_its_side_and_the_bridge_recovers(relayed):
    # The trainer gives up after 4 s without feedback; the bridge's own bound is set out of the way
    # (60 s), so what it learns after the partition is the trainer's close, delivered late.
    trainer, relay = relayed(trainer_settings(horizon=50, feedbacks_per_connection=8, feedback_timeout_s=4.0))
    with process(probe_command(relay.uri, "--mode", "timer", "--answer-timeout", "60")) as probe:
        assert relay.wait_writes_down(4, 60), probe.output()
        relay.partition()
        # the trainer's close happens inside the partition (its close frame and FIN wait in the relay)
        assert relay.wait_trainer_closed(60), probe.output()
        held = probe.output()
        relay.heal()
        code = probe.wait(180)
        report = trainer.report(timeout=30)
        output = probe.output()
    assert "(connection 2)" not in held, held
    assert code == 0, output
    assert "Feedback timeout" in output, output  # the bridge heard the trainer's close once the link came back
    assert_every_clause_passes(report, output, 8)


def test_two_raw_cameras_behind_a_5_mbit_uplink_keep_memory_flat_and_every_message_intact():
    # The issue asks for 2 minutes; CI's budget allows 30 s of the capped run (about 70 chunks of
    # 1.8 MB at ~2.4 steps/s); bench/bench_network.py runs the same case longer.
    why = netns_unavailable()
    if why is not None:
        pytest.skip(why)
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_network

    with tempfile.TemporaryDirectory() as workdir:
        r = bench_network.run_cap_case("raw, reuse", "raw640", None, True, 30.0, Path(workdir))
    assert r["steps_per_s"] > 0, r
    assert r["link_mbit"] < bench_network.CAP_MBIT * 1.1, r  # the cap held (else this measured nothing)
    assert r["rss_max_mb"] - r["rss_first_mb"] < 50, r  # a growing send queue would add 1.8 MB a step
    assert r["protocol_breaks"] == 0 and r["connections"] == 0, r  # one connection throughout, nothing broken
