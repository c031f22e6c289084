"""Deploy mode without ROS: robots stepped at 50 Hz, each with its own connection, against real policy servers.

The servers run as processes (``plugrl-test-policy-server``); each robot
sends its tick count as its state, so every applied action can be decoded
into the chunk, row and tick it was computed for. Nothing here asserts on
timing: the checks are that an applied action is always the one computed
for its tick, and which robots move at all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from plugrl_ros.policy.deploy import DeployRobot, Note
from plugrl_ros.policy.execution import ExecutionSettings
from plugrl_ros.policy.runner import PolicyRunner
from plugrl_ros.protocol.backoff import Backoff
from plugrl_ros.protocol.client import ClientSettings
from plugrl_ros.protocol.policy.client import (
    AnswerRejected,
    ChunkReceived,
    PolicyConnected,
    PolicyDisconnected,
    ServerTraceback,
)
from plugrl_ros.protocol.policy.link import PolicyLinks
from plugrl_ros.protocol.policy.request import RequestInput, RequestLayout
from plugrl_ros.protocol.policy.session import Chunk, Expectation, ServerMetadata
from plugrl_ros.tools.test_policy_server import decode_row

pytestmark = [pytest.mark.websockets]

PERIOD = 0.02
LAYOUT = RequestLayout((RequestInput(("observation", "state"), "states.joints"),), "/")
TIMEOUT = 60


class Server:
    """``plugrl-test-policy-server`` as a process."""

    def __init__(self, *args: str, port: int = 0) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "plugrl_ros.tools.test_policy_server", "--port", str(port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        line = self.process.stdout.readline()
        assert line.startswith("listening on ws://"), line + self.process.stderr.read()
        self.port = int(line.rsplit(":", 1)[1])

    def settings(self, **kw) -> ClientSettings:
        return ClientSettings(uri=f"ws://127.0.0.1:{self.port}", reconnect_initial_s=0.05, reconnect_max_s=0.2, **kw)

    def kill(self) -> None:
        self.process.kill()
        self.process.communicate(timeout=TIMEOUT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            self.process.communicate(timeout=TIMEOUT)


class Loop:
    """Robots ticked every PERIOD on this thread; link events applied between ticks."""

    def __init__(self, servers: list[ClientSettings], execution: ExecutionSettings) -> None:
        self.wake = threading.Event()
        self.links = PolicyLinks(servers, [Expectation(min_width=3)] * len(servers), self.wake.set)
        self.robots = [DeployRobot(PolicyRunner(execution, PERIOD, time.monotonic), LAYOUT) for _ in servers]
        self.applied: list[list[tuple[int, np.ndarray | None]]] = [[] for _ in servers]
        self.events: list[list] = [[] for _ in servers]
        self.notes: list[Note] = []

    def __enter__(self) -> Loop:
        self.links.start()
        return self

    def __exit__(self, *exc) -> None:
        self.links.stop()
        assert self.links.join(TIMEOUT)

    def run(self, until: Callable[[], bool], max_ticks: int) -> None:
        next_tick = time.monotonic()
        for _ in range(max_ticks):
            if until():
                return
            next_tick += PERIOD
            time.sleep(max(0.0, next_tick - time.monotonic()))  # the control timer
            for index, event in self.links.drain():
                self.events[index].append(event)
                note = self.robots[index].on_event(event)
                if note is not None:
                    self.notes.append(note)
            for index, robot in enumerate(self.robots):
                tick = robot.runner.tick + 1
                step = robot.tick(lambda tick=tick: {"states.joints": np.array([float(tick)])})
                self.applied[index].append((robot.runner.tick, step.action))
                if step.request is not None:
                    self.links.request(index, step.request.epoch, step.request.observation, step.request.tag)
                if step.abort is not None:
                    self.links.abort(index, *step.abort)
        raise AssertionError(f"not done within {max_ticks} ticks; notes: {[n.text for n in self.notes][-5:]}")

    def moved(self, robot: int) -> list[tuple[int, np.ndarray]]:
        return [(t, a) for t, a in self.applied[robot] if a is not None]


def assert_aligned(applied: list[tuple[int, np.ndarray]]) -> None:
    for tick, action in applied:
        _, index, stamp = decode_row(action)
        assert stamp + index == tick, (tick, index, stamp)


@pytest.mark.parametrize("mode", ["switch", "ensemble", "crossfade", "sync"])
def test_two_robots_each_apply_only_the_rows_computed_for_their_ticks(mode):
    server = Server("--horizon", "10", "--action-dim", "4", "--latency", "0.02", "--jitter", "0.02")
    try:
        with Loop([server.settings()] * 2, ExecutionSettings(mode=mode)) as loop:
            loop.run(lambda: all(len(loop.moved(r)) >= 60 for r in (0, 1)), max_ticks=3000)
    finally:
        server.stop()
    for robot in (0, 1):
        if mode == "switch":
            assert_aligned(loop.moved(robot))
        if mode == "sync":  # whole chunks, from row 0
            assert decode_row(loop.moved(robot)[0][1])[1] == 0
        stats = loop.robots[robot].runner.stats()
        assert stats.chunks >= 6 and stats.rejected == 0
    connected = [e for e in loop.events[0] + loop.events[1] if isinstance(e, PolicyConnected)]
    assert len(connected) == 2  # one connection per robot


def test_a_slow_server_holds_back_only_its_own_robot():
    slow = Server("--latency", "30")
    fast = Server("--latency", "0.01")
    try:
        with Loop([slow.settings(), fast.settings()], ExecutionSettings()) as loop:
            loop.run(lambda: len(loop.moved(1)) >= 100, max_ticks=3000)
    finally:
        slow.stop()
        fast.stop()
    assert loop.moved(0) == []
    assert_aligned(loop.moved(1))
    assert loop.robots[0].runner.stats().waiting_steps == len(loop.applied[0])


def test_an_unanswered_request_is_abandoned_and_the_connection_reopened():
    server = Server("--latency", "5")
    try:
        execution = ExecutionSettings(max_latency_s=0.3, first_answer_s=0.3, initial_latency_s=0.1)
        with Loop([server.settings()], execution) as loop:
            loop.run(lambda: sum(isinstance(e, PolicyConnected) for e in loop.events[0]) >= 2, max_ticks=3000)
    finally:
        server.stop()
    assert loop.robots[0].runner.stats().abandoned >= 1
    details = [e.detail for e in loop.events[0] if isinstance(e, PolicyDisconnected)]
    assert any("no answer within 0.3 s (policy.latency.first_answer_s)" in d for d in details), details
    assert loop.moved(0) == []


def test_a_killed_server_idles_the_robot_at_the_next_tick_and_a_restarted_one_resumes_it():
    server = Server("--horizon", "50", "--latency", "0.01")
    port = server.port
    restarted = None
    try:
        with Loop([server.settings()], ExecutionSettings()) as loop:
            loop.run(lambda: len(loop.moved(0)) >= 20, max_ticks=3000)
            server.kill()  # mid-chunk: 50 steps, at most a few of them run
            loop.run(lambda: any(isinstance(e, PolicyDisconnected) for e in loop.events[0]), max_ticks=3000)
            lost_at = loop.robots[0].runner.tick
            loop.run(lambda: loop.robots[0].runner.tick >= lost_at + 5, max_ticks=100)
            restarted = Server("--horizon", "50", "--latency", "0.01", port=port)
            loop.run(lambda: len(loop.moved(0)) >= 60, max_ticks=3000)
    finally:
        server.stop()
        if restarted is not None:
            restarted.stop()
    after = [a for t, a in loop.applied[0] if t > lost_at]
    assert after[:5] == [None] * 5  # idle from the tick after the loss was known
    assert_aligned(loop.moved(0))
    resumed = [decode_row(a)[0] for t, a in loop.moved(0) if t > lost_at]
    assert resumed and min(resumed) == 0  # only the restarted server's chunks (its count starts at 0)


# -- DeployRobot alone -----------------------------------------------------------------


class _Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _robot() -> DeployRobot:
    return DeployRobot(PolicyRunner(ExecutionSettings(), PERIOD, _Clock()), LAYOUT)


def _connected(epoch: int) -> PolicyConnected:
    return PolicyConnected(epoch, "ws://127.0.0.1:1", ServerMetadata({}, None, None))


def _chunk(epoch: int, tag: int) -> ChunkReceived:
    return ChunkReceived(epoch, tag, Chunk(np.ones((10, 3))), 0.01)


def test_a_robot_requests_only_when_connected_and_its_sources_are_ready():
    robot = _robot()
    ready = {"states.joints": np.array([1.0])}
    assert robot.tick(lambda: ready).request is None  # no connection yet
    assert robot.on_event(_connected(1)).level == "info"
    assert robot.tick(lambda: None).request is None  # sources not ready: no request ...
    step = robot.tick(lambda: ready)  # ... until they are
    assert step.request.epoch == 1 and step.request.observation == {"observation/state": ready["states.joints"]}
    robot.on_event(_chunk(1, step.request.tag))
    assert robot.tick(lambda: ready).action is not None


def test_a_server_announcing_one_step_chunks_is_warned_of_unless_the_robot_runs_sync():
    announced = PolicyConnected(1, "ws://127.0.0.1:1", ServerMetadata({}, 1, 3))
    note = _robot().on_event(announced)  # switch, the default: every answer would come after its one step
    assert note.level == "warn" and "(H=1) in switch" in note.text and "policy.execution.mode: sync" in note.text
    synced = DeployRobot(PolicyRunner(ExecutionSettings(mode="sync"), PERIOD, _Clock()), LAYOUT)
    assert synced.on_event(announced).level == "info"


def test_an_answer_from_a_connection_already_lost_never_runs():
    robot = _robot()
    robot.on_event(_connected(1))
    robot.tick(lambda: None)
    step = robot.tick(lambda: {"states.joints": np.zeros(1)})
    robot.on_event(PolicyDisconnected(1, "dropped", 1006))
    robot.on_event(_connected(2))
    robot.on_event(_chunk(1, step.request.tag))  # late, from the old connection
    assert robot.tick(lambda: None).action is None
    assert robot.runner.stats().chunks == 0


def test_a_server_traceback_is_logged_as_an_error_with_its_end_kept():
    robot = _robot()
    text = "Traceback (most recent call last):\n" + "  frame\n" * 5000 + "ValueError: the real cause"
    note = robot.on_event(ServerTraceback(1, text))
    assert note.level == "error" and note.text.endswith("ValueError: the real cause") and len(note.text) < 9000
    rejected = robot.on_event(AnswerRejected(1, 0, "actions: holds nan at step 0, value 1"))
    assert rejected.level == "error" and "holds nan" in rejected.text


def test_rejected_answers_are_said_once_and_asked_again_only_after_the_link_s_backoff():
    clock = _Clock()
    robot = DeployRobot(
        PolicyRunner(ExecutionSettings(), PERIOD, clock), LAYOUT, Backoff(1.0, 4.0, jitter=False), clock
    )
    ready = {"states.joints": np.array([1.0])}
    robot.on_event(_connected(1))
    wrong = "actions: has a horizon of 8 steps, expected 4 (shape [8, 3])"
    notes = []
    for delay in (1.0, 2.0, 4.0, 4.0):
        request = robot.tick(lambda: ready).request
        assert request is not None
        notes.append(robot.on_event(AnswerRejected(1, request.tag, wrong)))
        clock.now += delay - 0.01
        assert robot.tick(lambda: ready).request is None  # still backing off
        clock.now += 0.02
    assert notes[0].level == "error" and "has a horizon of 8" in notes[0].text and notes[1:] == [None] * 3
    assert robot.problem == wrong
    request = robot.tick(lambda: ready).request
    fits = robot.on_event(_chunk(1, request.tag))  # a valid answer ends the backoff and the problem
    assert fits.level == "info" and robot.problem == ""
    requests = [robot.tick(lambda: ready).request for _ in range(20)]
    request = next(r for r in requests if r is not None)  # at the runner's pace again, not after a delay
    assert robot.on_event(AnswerRejected(1, request.tag, wrong)).level == "error"  # a new bout is said again
