"""An actuator behind an action server: each step's command is sent as a goal, under a rate and preemption rule.

Many grippers and arm stacks take commands only through action servers (ros2_control's
gripper_action_controller, FollowJointTrajectory). The env publishes to this object as to a topic
publisher; what differs is decided here:

- a step that comes while the last goal still runs replaces it (the old one is cancelled: the robot
  follows the newest command) or is skipped (``running_goal: skip``: a gripper finishes closing);
- at most one goal per ``goal_period_s``: the steps in between send nothing;
- a goal the server rejects or aborts is reported to the env (``on_failure``): a WARN, and the episode is
  truncated, since the robot did not do what the trainer was told it did;
- a server that is not there counts as an actuator without a subscriber: no chunk starts (the env is
  held idle) until it is back, and ``rclpy``'s client finds it again on its own.

While idle, ``hold`` sends nothing: the server keeps (or holds) its last goal, and sending it again would
only restart it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient
from rclpy.node import Node


class GoalGate:
    """Whether a step's goal goes out now: the rate limit and the running-goal rule (pure, clock given)."""

    def __init__(self, running_goal: str, goal_period_s: float, tick_s: float) -> None:
        """``tick_s``: the control period. Steps come on ticks, a little early or late: a goal period of 5
        ticks must let every 5th step through, not every 6th when a tick comes a millisecond early."""
        assert running_goal in ("replace", "skip"), running_goal
        self.running_goal = running_goal
        self.goal_period_s = goal_period_s
        self._slack_s = tick_s / 2
        self._last_sent_s = -math.inf

    def admits(self, now_s: float, running: bool) -> bool:
        """True if a goal may be sent at ``now_s``, while a goal is (or is not) ``running``."""
        if self.goal_period_s > 0 and now_s - self._last_sent_s < self.goal_period_s - self._slack_s:
            return False
        return not (running and self.running_goal == "skip")

    def sent(self, now_s: float) -> None:
        self._last_sent_s = now_s


class GoalActuator:
    """Sends goals to one action server; quacks like the publisher the env would otherwise hold."""

    holds_on_its_own = True  # idle "hold" sends nothing: the server keeps its last goal

    def __init__(
        self,
        node: Node,
        action_type: type,
        name: str,
        gate: GoalGate,
        callback_group: object,
        clock_s: Callable[[], float],
        on_failure: Callable[[str], None],
    ) -> None:
        """``on_failure(why)``: a goal was rejected or aborted (called on the executor thread)."""
        self._client = ActionClient(node, action_type, name, callback_group=callback_group)
        # as a publisher's topic_name reads: resolved in the node's namespace
        self.topic_name = name if name.startswith("/") else f"{node.get_namespace().rstrip('/')}/{name}"
        self._gate = gate
        self._clock_s = clock_s
        self._on_failure = on_failure
        self._unanswered: set[int] = set()  # goals sent, by number, not yet accepted or rejected
        self._live: dict[int, Any] = {}  # accepted goals' handles, by number, until their result
        self._replaced: set[int] = set()  # goals cancelled for a newer one: their outcome is no failure
        self._requested = 0  # goals sent so far: the newest goal's number
        self.goals_sent = 0
        self.goals_failed = 0

    def get_subscription_count(self) -> int:
        """1 while the action server is there (what an actuator topic's subscriber count says)."""
        return 1 if self._client.server_is_ready() else 0

    def wait_for_all_acked(self, timeout: Any) -> bool:
        del timeout  # a goal is answered by the server's acceptance, not acknowledged by DDS
        return True

    def publish(self, goal: Any) -> bool:
        """Send ``goal`` if the server is there and the gate admits it; False if nothing was sent."""
        if not self._client.server_is_ready():
            # a server that went away answers none of its goals: nothing runs any more
            self._unanswered.clear()
            self._live.clear()
            self._replaced.clear()
            return False
        now = self._clock_s()
        running = bool(self._unanswered or self._live)
        if not self._gate.admits(now, running):
            return False
        if self._gate.running_goal == "replace":
            for older in list(self._live):
                self._replace(older)  # the robot follows the newest command
        self._requested += 1
        number = self._requested
        self._unanswered.add(number)
        future = self._client.send_goal_async(goal)
        future.add_done_callback(lambda done: self._answered(number, done))
        self._gate.sent(now)
        self.goals_sent += 1
        return True

    def _answered(self, number: int, future: Any) -> None:
        self._unanswered.discard(number)
        handle = future.result()
        if handle is None or not handle.accepted:
            self._failed(f"the goal was rejected by {self.topic_name}")
            return
        self._live[number] = handle
        handle.get_result_async().add_done_callback(lambda done: self._finished(number, done))
        if number != self._requested and self._gate.running_goal == "replace":
            self._replace(number)  # accepted after a newer goal went out: already replaced

    def _replace(self, number: int) -> None:
        """Cancel a running goal a newer one replaces (once: it leaves the running goals)."""
        self._live.pop(number).cancel_goal_async()
        self._replaced.add(number)

    def _finished(self, number: int, future: Any) -> None:
        self._live.pop(number, None)
        if number in self._replaced:
            self._replaced.discard(number)
            return  # cancelled, or ended otherwise after it was replaced: the newer goal is what counts
        result = future.result()
        status = GoalStatus.STATUS_UNKNOWN if result is None else result.status
        if status == GoalStatus.STATUS_ABORTED:
            self._failed(f"the goal was aborted by {self.topic_name}")

    def _failed(self, why: str) -> None:
        self.goals_failed += 1
        self._on_failure(why)

    def destroy(self) -> None:
        self._client.destroy()
