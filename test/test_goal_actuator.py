"""Tests for plugrl_ros.robot.goal_actuator's gate: the rate limit and the running-goal rule (clock given)."""

from __future__ import annotations

import pytest

from plugrl_ros.robot.goal_actuator import GoalGate

# ros: the actuator module imports rclpy.action (the gate itself is pure)
pytestmark = [pytest.mark.ros]


def sent_at(gate: GoalGate, times: list[float], running: bool = False) -> list[float]:
    out = []
    for now in times:
        if gate.admits(now, running):
            gate.sent(now)
            out.append(now)
    return out


def test_without_a_period_every_step_is_a_goal():
    assert sent_at(GoalGate("replace", 0.0, 0.02), [0.0, 0.02, 0.04]) == [0.0, 0.02, 0.04]


def test_a_goal_period_lets_one_goal_through_per_period_and_the_steps_between_send_none():
    times = [round(0.02 * i, 2) for i in range(26)]  # 50 Hz for half a second
    assert sent_at(GoalGate("replace", 0.1, 0.02), times) == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]


def test_a_tick_a_little_early_still_lets_the_goal_through():
    # ticks jitter: 5 ticks of 20 ms that took 99 ms are a goal period of 0.1 s
    assert sent_at(GoalGate("replace", 0.1, 0.02), [0.0, 0.099, 0.185]) == [0.0, 0.099]


@pytest.mark.parametrize(("rule", "admitted"), [("replace", True), ("skip", False)])
def test_while_a_goal_runs_a_step_replaces_it_or_is_skipped(rule, admitted):
    gate = GoalGate(rule, 0.0, 0.02)
    assert gate.admits(1.0, running=True) is admitted
    assert gate.admits(1.0, running=False), "with no goal running, either rule sends"


# --- the actuator, on a stand-in for rclpy's ActionClient ------------------------------------------


class FakeFuture:
    def __init__(self) -> None:
        self._callbacks: list = []
        self._result = None

    def add_done_callback(self, callback) -> None:
        self._callbacks.append(callback)

    def result(self):
        return self._result

    def finish(self, value) -> None:
        self._result = value
        for callback in self._callbacks:
            callback(self)


class FakeHandle:
    def __init__(self, accepted: bool) -> None:
        self.accepted = accepted
        self.cancels = 0
        self.result_future = FakeFuture()

    def cancel_goal_async(self) -> None:
        self.cancels += 1

    def get_result_async(self) -> FakeFuture:
        return self.result_future


class FakeClient:
    instances: list[FakeClient] = []

    def __init__(self, node, action_type, name, callback_group=None) -> None:
        self.ready = True
        self.sent: list[tuple[object, FakeFuture]] = []
        FakeClient.instances.append(self)

    def server_is_ready(self) -> bool:
        return self.ready

    def send_goal_async(self, goal) -> FakeFuture:
        future = FakeFuture()
        self.sent.append((goal, future))
        return future


class FakeNode:
    def get_namespace(self) -> str:
        return "/robot1"


class Result:
    def __init__(self, status: int) -> None:
        self.status = status


@pytest.fixture
def actuator(monkeypatch):
    from plugrl_ros.robot import goal_actuator

    monkeypatch.setattr(goal_actuator, "ActionClient", FakeClient)
    failures: list[str] = []

    def make(rule: str) -> tuple[goal_actuator.GoalActuator, FakeClient, list[str]]:
        gate = GoalGate(rule, 0.0, 0.02)
        made = goal_actuator.GoalActuator(FakeNode(), object, "grip", gate, None, lambda: 0.0, failures.append)
        return made, FakeClient.instances[-1], failures

    return make


def accept(client: FakeClient, index: int, accepted: bool = True) -> FakeHandle:
    handle = FakeHandle(accepted)
    client.sent[index][1].finish(handle)
    return handle


def test_replace_cancels_a_goal_accepted_after_a_newer_one_went_out_and_a_replaced_goals_end_is_no_failure(actuator):
    from action_msgs.msg import GoalStatus

    goals, client, failures = actuator("replace")
    assert goals.topic_name == "/robot1/grip"
    assert goals.publish("g1") and goals.publish("g2")  # g2 before g1 was even accepted
    first = accept(client, 0)
    assert first.cancels == 1, "a goal accepted after a newer one must be cancelled at once"
    second = accept(client, 1)
    assert goals.publish("g3") and second.cancels == 1 and first.cancels == 1
    first.result_future.finish(Result(GoalStatus.STATUS_ABORTED))  # a replaced goal's end: no failure
    assert failures == []
    third = accept(client, 2)
    third.result_future.finish(Result(GoalStatus.STATUS_ABORTED))
    assert failures == ["the goal was aborted by /robot1/grip"]


def test_skip_sends_nothing_while_a_goal_is_unanswered_or_running_and_a_rejection_is_a_failure(actuator):
    from action_msgs.msg import GoalStatus

    goals, client, failures = actuator("skip")
    assert goals.publish("g1")
    assert not goals.publish("g2"), "sent while the last goal was not yet accepted"
    handle = accept(client, 0)
    assert not goals.publish("g3"), "sent while the last goal ran"
    handle.result_future.finish(Result(GoalStatus.STATUS_SUCCEEDED))
    assert goals.publish("g4") and [g for g, _ in client.sent] == ["g1", "g4"]
    accept(client, 1, accepted=False)
    assert failures == ["the goal was rejected by /robot1/grip"]


def test_a_server_that_went_away_answers_nothing_so_its_goals_stop_counting_as_running(actuator):
    goals, client, _ = actuator("skip")
    assert goals.publish("g1")
    client.ready = False
    assert goals.get_subscription_count() == 0 and not goals.publish("g2")
    client.ready = True
    assert goals.get_subscription_count() == 1 and goals.publish("g3"), "a goal lost with its server blocked skip"
