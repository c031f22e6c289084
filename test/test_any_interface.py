"""A robot whose interfaces the bridge has no code for, mapped from YAML alone, through the bridge as a real process.

The robot (an rclpy node in this process) publishes a test_msgs message the bridge has no typed converter
for and takes its commands in another; the trainer is :class:`trainer_fixture.ScriptedTrainer`. The tests
check content and order, never timing: every observation row is exactly what the paths select from one
message the robot published, and every command is exactly the chunk's step, in order (commands sent
before DDS matched the robot's reader may be lost at the start, as test_record_bridge allows).
"""

from __future__ import annotations

import itertools
import math
import threading

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from harness import (
    WARN,
    bridge,
    bridge_params,
    env_status,
    first_diag,
    obs_of,
    of_kind,
    wait_until,
)
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from sensor_msgs.msg import LaserScan
from test_msgs.action import Fibonacci
from test_msgs.msg import BasicTypes, Nested, UnboundedSequences
from trainer_fixture import ScriptedTrainer

from plugrl_ros.ros.qos import qos_profile

pytestmark = [pytest.mark.ros, pytest.mark.websockets_incidental, pytest.mark.slow, pytest.mark.timeout(90)]

HORIZON = 4
# Commands published before DDS matched the robot's reader are lost (test_bridge_node's bound).
MAX_LOST_AT_START = 30
TACTILE = {
    "topic": "tactile",
    "type": "test_msgs/msg/UnboundedSequences",
    "fields": ["float64_values[1:3]", "basic_types_values[0:2].int32_value"],
}
SCAN = {"topic": "scan", "type": "sensor_msgs/LaserScan", "beams": 4}
TOOL = {
    "topic": "tool",
    "type": "test_msgs/Nested",
    "fields": ["basic_types_value.float64_value", "basic_types_value.int16_value"],
    "defaults": {"basic_types_value": {"uint8_value": 7, "bool_value": True}},
    "idle": "none",
}


GRIP = {"topic": "grip", "type": "test_msgs/action/Fibonacci", "fields": ["order"], "slice": [2, 3], "idle": "none"}


class GoalServer:
    """The robot's action server: records each goal's order as it arrives; aborts or rejects chosen orders;
    each goal runs ``run_s`` (0: done at once), cancellable; ``overlaps`` counts goals that arrived while
    another still ran."""

    def __init__(
        self, robot, run_s: float = 0.0, abort: set[int] = frozenset(), reject: set[int] = frozenset()
    ) -> None:
        self.lock = threading.Lock()
        self.orders: list[int] = []
        self.cancelled: list[int] = []
        self.overlaps = 0
        self._running = 0
        self._node = robot.node
        self._run_s, self._abort, self._reject = run_s, abort, reject
        self._server = ActionServer(
            robot.node,
            Fibonacci,
            "/grip",
            self._execute,
            goal_callback=self._goal,
            cancel_callback=lambda handle: CancelResponse.ACCEPT,
        )

    def _goal(self, request) -> GoalResponse:
        with self.lock:
            self.orders.append(request.order)
        return GoalResponse.REJECT if request.order in self._reject else GoalResponse.ACCEPT

    async def _execute(self, handle):
        with self.lock:
            self.overlaps += self._running > 0
            self._running += 1
        try:
            if self._run_s > 0:
                await self._sleep(self._run_s, handle)
            if handle.is_cancel_requested:
                with self.lock:
                    self.cancelled.append(handle.request.order)
                handle.canceled()
            elif handle.request.order in self._abort:
                handle.abort()
            else:
                handle.succeed()
            return Fibonacci.Result()
        finally:
            with self.lock:
                self._running -= 1

    async def _sleep(self, seconds: float, handle) -> None:
        """Wait on the robot's executor (a coroutine callback), ending early on a cancel request."""
        from rclpy.task import Future

        done = Future()
        timer = self._node.create_timer(seconds, lambda: done.done() or done.set_result(True))
        poll = self._node.create_timer(
            0.01, lambda: handle.is_cancel_requested and not done.done() and done.set_result(True)
        )
        try:
            await done
        finally:
            self._node.destroy_timer(timer)
            self._node.destroy_timer(poll)

    def received(self) -> list[int]:
        with self.lock:
            return list(self.orders)

    def close(self) -> None:
        # rclpy's destroy_node leaves an action server alive: a later test's bridge would find this one
        self._server.destroy()


@pytest.fixture
def goal_server(robot):
    """``goal_server(**options)`` makes the robot's action server; each is destroyed after the test."""
    made: list[GoalServer] = []

    def make(**options) -> GoalServer:
        made.append(GoalServer(robot, **options))
        return made[-1]

    yield make
    for server in made:
        server.close()


def tactile(n: int, sequence_length: int = 4) -> UnboundedSequences:
    """The robot's sensor after ``n`` commands: each selected value tells which field and which n it is."""
    msg = UnboundedSequences(float64_values=[n, n + 0.5, n + 0.25, 99.0][:sequence_length])
    msg.basic_types_values = [BasicTypes(int32_value=2 * n), BasicTypes(int32_value=-n), BasicTypes(int32_value=5)]
    return msg


def laser_scan(n: int) -> LaserScan:
    """A scan of 8 readings after ``n`` commands: two per beam, one of each pair invalid or farther."""
    ranges = [n + 1.0, math.inf, n + 3.0, n + 0.5, math.nan, n + 2.0, 50.0, n + 4.0]
    return LaserScan(range_min=0.1, range_max=40.0, ranges=ranges)


def scan_selected(n: int) -> list[float]:
    """The nearest valid return of each 2-reading sector of ``laser_scan(n)``."""
    return [n + 1.0, n + 0.5, n + 2.0, n + 4.0]


def selected(n: int) -> list[float]:
    """What the paths select from ``tactile(n)``."""
    return [n + 0.5, n + 0.25, 2.0 * n, -float(n)]


class CountingRobot:
    """Counts the commands it takes and publishes its sensor after each one and on a timer."""

    def __init__(self, robot) -> None:
        self.lock = threading.Lock()
        self.commands: list[Nested] = []
        self.sequence_length = 4
        self._publisher = robot.node.create_publisher(UnboundedSequences, "/tactile", qos_profile("reliable", 10))
        self._scan = robot.node.create_publisher(LaserScan, "/scan", qos_profile("reliable", 10))
        robot.node.create_subscription(Nested, "/tool", self._on_command, qos_profile("reliable", 100))
        robot.node.create_timer(0.02, self._publish)

    def _on_command(self, msg: Nested) -> None:
        with self.lock:
            self.commands.append(msg)
        self._publish()

    def _publish(self) -> None:
        with self.lock:
            n, length = len(self.commands), self.sequence_length
        self._publisher.publish(tactile(n, length))
        self._scan.publish(laser_scan(n))

    def taken(self) -> list[Nested]:
        with self.lock:
            return list(self.commands)


def numbered_chunks():
    """Chunk c's step k is worth c * HORIZON + k: the commands, in order, count 0, 1, 2, ..."""
    chunks = []

    def actions(env_indices, step_ids, observation):
        base = len(chunks) * HORIZON
        chunks.append(base)
        chunk = np.zeros((HORIZON, len(env_indices), 3), dtype="<f4")
        chunk[:, :, 0] = (base + np.arange(HORIZON))[:, None]
        chunk[:, :, 1] = -2.0 * chunk[:, :, 0]
        chunk[:, :, 2] = chunk[:, :, 0]  # the goal's order: the step's number
        return chunk

    return actions


def check_rows(messages: list[dict], name: str = "tactile") -> list[int]:
    """Every observation row of state ``name`` is what its configuration selects from one message the
    robot published; returns the robot's command count n of each, in order."""
    ns = []
    for message in messages:
        row = obs_of(message)["states"][name]
        assert row.shape == (1, 4) and row.dtype == np.float64, row
        if name == "tactile":
            n = round(float(row[0, 0]) - 0.5)
            expected = selected(n)
        else:
            n = round(float(row[0, 0]) - 1.0)
            expected = scan_selected(n)
        np.testing.assert_array_equal(row[0], expected, err_msg=f"a {name} row is not what its keys select")
        ns.append(n)
    return ns


def check_goals(orders: list[int]) -> None:
    """The goals are the chunks' steps in order, as the commands are."""
    assert orders, "no goal reached the action server"
    first = orders[0]
    assert first <= MAX_LOST_AT_START, f"the first {first} goals were lost"
    assert orders == list(range(first, first + len(orders))), f"goals out of order or missing: {orders}"


def check_commands(commands: list[Nested]) -> None:
    """The commands are the chunks' steps in order (0, 1, 2, ...) after at most a few lost at the start."""
    values = [c.basic_types_value.float64_value for c in commands]
    first = int(values[0])
    assert first <= MAX_LOST_AT_START, f"the first {first} commands were lost"
    assert values == [float(first + i) for i in range(len(values))], f"commands out of order or missing: {values}"
    for command in commands:
        element = command.basic_types_value
        assert element.int16_value == -2 * int(element.float64_value), "the second path's value"
        assert (element.uint8_value, element.bool_value) == (7, True), "a default was not kept"


@pytest.mark.parametrize("mode", ["lockstep", "timer"])
def test_a_message_type_without_converter_code_is_observed_and_commanded_by_its_field_paths(
    tmp_path, robot, goal_server, mode
):
    device = CountingRobot(robot)
    gripper = goal_server()
    params = {
        "control": {"mode": mode},
        "observations": {"states": {"tactile": TACTILE, "scan": SCAN}},
        "actions": {"tool": {**TOOL, "slice": [0, 2]}, "grip": GRIP},
    }
    with ScriptedTrainer({"action_horizon": HORIZON, "action_dim": 3}, numbered_chunks()) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            trainer.wait_for(lambda r: len(of_kind(r, "feedback")) >= 4, 30, "4 feedbacks")
            wait_until(lambda: len(device.taken()) >= 3 * HORIZON, 20, "three chunks of commands")
            records = trainer.records()
    messages = [m for _, m in records if m["message_type"] in ("infer", "feedback")]
    for name in ("tactile", "scan"):
        ns = check_rows(messages, name)
        assert ns == sorted(ns), f"{name} observations went back in time: {ns}"
        assert ns[-1] > ns[0], f"the robot's commands never showed in its {name} observations"
    check_commands(device.taken())
    check_goals(gripper.received())


def test_a_sequence_shorter_than_its_path_idles_the_env_with_a_warning_until_one_holds_the_width(tmp_path, robot):
    device = CountingRobot(robot)
    device.sequence_length = 2  # float64_values[1:3] needs 3
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    params = {"observations": {"states": {"tactile": TACTILE}}, "actions": {"tool": TOOL}}
    params["control"] = {"action_dim": 3}  # the trainer's third value is for a gripper this robot lacks
    with ScriptedTrainer({"action_horizon": HORIZON, "action_dim": 3}, numbered_chunks()) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            first_diag(
                diagnostics,
                lambda m: (
                    env_status(m, 0)[0] == WARN and "reads 3 elements but the message has 2" in env_status(m, 0)[1]
                ),
                30,
                "the env's WARN naming the short path",
            )
            assert not trainer.messages("infer"), "a short message went into an infer"
            assert not device.taken(), "the robot was commanded on a short message"
            with device.lock:
                device.sequence_length = 4
            trainer.wait_for(lambda r: len(of_kind(r, "infer")) >= 2, 30, "infers once the messages fit")
            wait_until(lambda: "float64_values[1:3]' reads 3 elements" in child.output(), 10, "the logged warning")
            records = trainer.records()
    check_rows([m for _, m in records if m["message_type"] in ("infer", "feedback")])
    assert "[WARN]" in next(line for line in child.output().splitlines() if "reads 3 elements" in line)


ACTUATORS = {"tool": {**TOOL, "slice": [0, 2]}}


def test_a_rejected_or_an_aborted_goal_truncates_the_episode_with_a_warning(tmp_path, robot, goal_server):
    CountingRobot(robot)
    # every tenth step's goal is aborted, and another's rejected: on a loaded host a goal may be replaced by the
    # next step's before the server runs it (canceled, not aborted), so one chance of each would not be enough
    abort, reject = set(range(5, 400, 10)), set(range(9, 400, 10))
    gripper = goal_server(abort=abort, reject=reject)
    params = {"observations": {"states": {"tactile": TACTILE}}, "actions": {**ACTUATORS, "grip": GRIP}}
    warned = ("actions.grip: the goal was aborted by /grip", "actions.grip: the goal was rejected by /grip")
    with ScriptedTrainer({"action_horizon": HORIZON, "action_dim": 3}, numbered_chunks()) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            wait_until(lambda: all(w in child.output() for w in warned), 60, "both failures warned")
            trainer.wait_for(
                lambda r: sum(bool(m["data"]["truncated"][0]) for m in of_kind(r, "feedback")) >= 2,
                20,
                "two truncated episodes",
            )
            feedbacks = trainer.messages("feedback")
            failed_goals = len(set(gripper.received()) & (abort | reject))
    assert set(gripper.received()) & abort and set(gripper.received()) & reject
    # no time limit and no episode topics: only failed goals ended episodes, each at most one
    assert 2 <= sum(bool(m["data"]["truncated"][0]) for m in feedbacks) <= failed_goals
    assert not any(m["data"]["terminated"][0] for m in feedbacks)
    for line in (line for line in child.output().splitlines() if "the goal was" in line):
        assert "[WARN]" in line and "the episode is truncated" in line, line


@pytest.mark.parametrize("rule", ["skip", "replace"])
def test_a_step_while_a_goal_runs_is_skipped_or_replaces_the_running_goal(tmp_path, robot, goal_server, rule):
    CountingRobot(robot)
    gripper = goal_server(run_s=0.15)  # several control ticks (50 Hz) per goal
    grip = {**GRIP, "running_goal": rule}
    params = {"observations": {"states": {"tactile": TACTILE}}, "actions": {**ACTUATORS, "grip": grip}}
    with ScriptedTrainer({"action_horizon": HORIZON, "action_dim": 3}, numbered_chunks()) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            wait_until(lambda: len(gripper.received()) >= 6, 30, "six goals")
            trainer.wait_for(lambda r: len(of_kind(r, "feedback")) >= 2, 20, "two feedbacks")
    orders = gripper.received()
    with gripper.lock:
        overlaps, cancelled = gripper.overlaps, list(gripper.cancelled)
    if rule == "skip":
        # a goal is sent only once the last one's result came: never two at once, and steps in between are skipped
        assert overlaps == 0, f"{overlaps} goals arrived while another ran"
        assert orders == sorted(set(orders)), orders
        assert max(b - a for a, b in itertools.pairwise(orders)) > 1, f"no step was skipped: {orders}"
        assert not cancelled
    else:
        # every step is a goal, and a newer goal cancels the one still running
        check_goals(orders)
        assert cancelled, "no running goal was replaced"
        assert all(order < orders[-1] for order in cancelled), "the newest goal was cancelled"


def test_without_its_action_server_the_env_is_held_idle_and_starts_when_the_server_appears(
    tmp_path, robot, goal_server
):
    CountingRobot(robot)
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    params = {"observations": {"states": {"tactile": TACTILE}}, "actions": {**ACTUATORS, "grip": GRIP}}
    with ScriptedTrainer({"action_horizon": HORIZON, "action_dim": 3}, numbered_chunks()) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            first_diag(
                diagnostics,
                lambda m: "no subscriber on /grip (action server)" in env_status(m, 0)[1],
                30,
                "the env held for its action server",
            )
            assert not trainer.messages("infer"), "a chunk started without the action server"
            gripper = goal_server()
            wait_until(lambda: len(gripper.received()) >= HORIZON, 30, "goals once the server is there")
    check_goals(gripper.received())


def test_a_reset_service_of_another_type_gets_its_request_fields_and_a_false_success_field_is_retried(tmp_path, robot):
    from test_msgs.srv import BasicTypes as HomingService

    CountingRobot(robot)
    lock, requests = threading.Lock(), []

    def home(request, response):
        with lock:
            requests.append((request.int32_value, request.string_value))
            homed = len(requests) >= 2  # the first call fails: the arm is not homed yet
        response.bool_value = homed
        response.string_value = "homed" if homed else "arm not homed"
        return response

    robot.node.create_service(HomingService, "/home", home)
    reset = {
        "mode": "service",
        "service": "home",
        "service_type": "test_msgs/srv/BasicTypes",
        "request": {"int32_value": 4, "string_value": "home"},
        "success_field": "bool_value",
        "message_field": "string_value",
        "retry_initial_s": 0.2,
    }
    params = {"observations": {"states": {"tactile": TACTILE}}, "actions": ACTUATORS, "reset": reset}
    params["control"] = {"action_dim": 3}  # the trainer's third value is for a gripper this robot lacks
    with ScriptedTrainer({"action_horizon": HORIZON, "action_dim": 3}, numbered_chunks()) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            trainer.wait_for(lambda r: len(of_kind(r, "infer")) >= 1, 30, "an infer after the reset")
            output = child.output()
    with lock:
        assert requests[:2] == [(4, "home"), (4, "home")], requests
    failed = [line for line in output.splitlines() if "reset of home failed" in line]
    assert failed and "answered bool_value=false: 'arm not homed'" in failed[0], output
