"""A robot whose messages are lost is said loudly and brought back: it never silently leaves training.

A simulator in lockstep publishes only in answer to a command or a reset. If
that answer is lost - published before the bridge's subscription matched, or
not published at all - robot and bridge wait for each other for ever. The
bridge must (a) not reset a robot before its topics have matched, and (b)
notice an env with no fresh observation for ``control.env_timeout_s``, warn
naming the env and the topic, show it on /diagnostics, and reset it again
(with the reset's backoff) so that it steps. The fake robot runs in this
process; the bridge is a real process and the trainer a real websocket server.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from harness import (
    bridge,
    bridge_params,
    env_status,
    first_diag,
    wait_until,
)
from std_msgs.msg import Bool, Float32, Float64MultiArray
from std_srvs.srv import Trigger
from trainer_fixture import ScriptedTrainer

from plugrl_ros.ros.qos import qos_profile

pytestmark = [pytest.mark.ros, pytest.mark.websockets, pytest.mark.slow, pytest.mark.timeout(120)]

ERROR = 2
_NAMESPACES = itertools.count(os.getpid() * 100)
SILENCE_WARNING = "no fresh observation for"

OBSERVE = {"states": {"pos": {"topic": "state", "type": "std_msgs/Float64MultiArray", "sync": True}}}
ACT = {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}}
REWARD = {"topic": "reward", "type": "std_msgs/Float32", "sync": True}
EPISODE = {"terminated_topic": "terminated", "sync": True}
RESET = {"mode": "service", "service": "reset", "timeout_s": 10.0, "retry_initial_s": 0.2, "retry_max_s": 1.0}


class SimRobot:
    """A one-env simulator as a lockstep robot: it publishes state, reward and terminated once per command and
    its state once per reset, and nothing else. ``lose_resets`` reset answers publish nothing (lost answers)."""

    def __init__(self, node: Any, lose_resets: int = 0, publish_now: bool = False, publishers: bool = True) -> None:
        # a namespace of its own: a robot of an earlier test in this domain may linger in DDS discovery
        self.ns = f"sim{next(_NAMESPACES)}"
        self.node = node
        self.lose_resets = lose_resets
        self.resets = 0
        self.steps = 0
        self._lock = threading.Lock()
        self._pubs: tuple[Any, Any, Any] | None = None
        node.create_subscription(Float64MultiArray, f"/{self.ns}/cmd", self._on_command, qos_profile("reliable", 10))
        node.create_service(Trigger, f"/{self.ns}/reset", self._on_reset)
        if publishers:
            self.create_publishers()
        if publish_now:  # before any bridge exists: nobody hears it
            self._publish_state()

    def create_publishers(self) -> None:
        qos = qos_profile("reliable", 10)
        pubs = (
            self.node.create_publisher(Float64MultiArray, f"/{self.ns}/state", qos),
            self.node.create_publisher(Float32, f"/{self.ns}/reward", qos),
            self.node.create_publisher(Bool, f"/{self.ns}/terminated", qos),
        )
        with self._lock:
            self._pubs = pubs

    def _publish_state(self) -> None:
        with self._lock:
            pubs = self._pubs
        if pubs is not None:
            pubs[0].publish(Float64MultiArray(data=[float(self.steps)]))

    def _on_command(self, msg: Float64MultiArray) -> None:
        self.steps += 1
        self._publish_state()
        assert self._pubs is not None
        self._pubs[1].publish(Float32(data=1.0))
        self._pubs[2].publish(Bool(data=False))

    def _on_reset(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        self.resets += 1
        if self.resets > self.lose_resets:
            self._publish_state()
        response.success = True
        return response


def params(uri: str, sim: SimRobot, mode: str = "lockstep", **overrides: Any) -> dict:
    sections: dict[str, Any] = {
        "envs": [sim.ns],
        "observations": OBSERVE,
        "actions": ACT,
        "reward": REWARD,
        "episode": EPISODE,
        "reset": RESET,
        "control": {"mode": mode, "env_timeout_s": 1.0},
    }
    for key, value in overrides.items():
        sections[key] = {**sections.get(key, {}), **value}
    return bridge_params(uri, **sections)


def silence_level(msg: DiagnosticArray) -> int:
    level, message, _ = env_status(msg, 0)
    return level if SILENCE_WARNING in message else -1


@pytest.mark.parametrize("mode", ["lockstep", "timer"])
def test_a_robot_whose_reset_answer_is_lost_is_reported_and_reset_again_until_it_steps(tmp_path, robot, mode):
    sim = SimRobot(robot.node, lose_resets=2)
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    with ScriptedTrainer({"action_horizon": 2, "action_dim": 1}) as trainer:
        with bridge(tmp_path, params(trainer.uri, sim, mode)) as child:
            trainer.wait_for(lambda records: len(records) >= 6, 40, "the robot to step after its lost answers")
            # said at the housekeeping tick after the observation came: it may follow the robot's first steps
            wait_until(lambda: "observing again" in child.output(), 5, "the bridge to say the env is heard again")
            output = child.output()
            first_diag(diagnostics, lambda m: silence_level(m) >= 1, 5, "the silence on /diagnostics")
    warnings = [line for line in output.splitlines() if SILENCE_WARNING in line]
    assert warnings and all("[WARN]" in line for line in warnings), output
    assert f"env 0 ({sim.ns})" in warnings[0] and f"waiting for {sim.ns}/state (no message yet)" in warnings[0], output
    assert output.count("resetting it for its silence") == 2, output  # once per lost answer, then it answers
    assert sim.resets == 3 and sim.steps >= 2
    # the infer carries the observation the third reset published, and the robot then steps on the chunk
    assert trainer.messages("infer")[0]["data"]["states"]["pos"].tolist() == [[0.0]]


def test_a_robot_that_published_before_the_bridge_subscribed_is_reset_and_steps(tmp_path, robot):
    # no reset at startup: the first observation would be that early message, which the bridge never heard
    sim = SimRobot(robot.node, publish_now=True)
    with ScriptedTrainer({"action_horizon": 1, "action_dim": 1}) as trainer:
        with bridge(tmp_path, params(trainer.uri, sim, reset={"on_start": False})) as child:
            trainer.wait_for(lambda records: len(records) >= 4, 30, "the robot to step after a reset")
            output = child.output()
    warning = next(line for line in output.splitlines() if SILENCE_WARNING in line)
    assert f"{sim.ns}/state (no message yet)" in warning and "resetting it in" in warning, output


def test_a_silent_robot_with_no_reset_configured_is_an_error_on_diagnostics(tmp_path, robot):
    sim = SimRobot(robot.node, publish_now=True)
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    with ScriptedTrainer({"action_horizon": 1, "action_dim": 1}) as trainer:
        sections = params(trainer.uri, sim, reset={"mode": "none"})
        with bridge(tmp_path, sections) as child:
            _, msg = first_diag(diagnostics, lambda m: silence_level(m) == ERROR, 20, "an ERROR for the silent env")
            wait_until(lambda: SILENCE_WARNING in child.output(), 10, "the warning in the log")
            output = child.output()
    _, message, _ = env_status(msg, 0)
    assert f"waiting for {sim.ns}/state (no message yet)" in message and "no reset is configured" in message
    assert "no reset is configured (reset.mode none)" in output
    assert not trainer.messages("infer")


def test_a_reset_waits_until_the_robots_topics_have_matched(tmp_path, robot):
    # The robot's reset service is up at once, its publishers only 8 s later: a reset called before they
    # matched would publish its answer to nobody. The bridge waits for them, so no answer is lost.
    sim = SimRobot(robot.node, publishers=False)
    timer = threading.Timer(8.0, sim.create_publishers)
    timer.start()
    try:
        with ScriptedTrainer({"action_horizon": 1, "action_dim": 1}) as trainer:
            with bridge(tmp_path, params(trainer.uri, sim, reset={"timeout_s": 20.0})) as child:
                trainer.wait_for(lambda records: len(records) >= 4, 40, "the robot to step")
                output = child.output()
    finally:
        timer.cancel()
    assert f"waiting for the robot's publishers on {sim.ns}/state" in output
    assert sim.resets == 1, output  # one reset, called once the topics had matched: its answer arrived
    assert SILENCE_WARNING not in output
