"""Deploy mode loses no answer: two demo reachers, a policy server answering in 80 ± 20 ms, dozens of resets.

Real processes throughout: ``plugrl-demo-robot`` (two reachers in timer mode, 20 Hz, 3 s episodes and a
reset service), ``plugrl-test-policy-server`` with H = 10, and the bridge in ``mode: deploy`` on the
executor it picks by itself. Before the fix, an answer the wakeup's fallback timer drained was dropped
(rclpy's EventsExecutor handed the timer's info to the drain's ``stopping`` parameter) while its request
stayed in flight: the robot idled at the chunk's end until the 5 s bound closed the link, about once in
two minutes of this setup.
"""

from __future__ import annotations

import re

import pytest
from harness import ROOT, process, python_module, wait_until

pytestmark = [pytest.mark.ros, pytest.mark.slow]

DEMO = ROOT / "config" / "demo.yaml"
RESETS = 30  # episodes ended (and reset) over both robots
WAIT_S = 240.0  # a hang guard: 30 episodes of 3 s on two robots take about 50 s


def _status(output: str, robot: str) -> re.Match[str] | None:
    """The last status line's counts for ``robot``: steps at boundaries idle, and episodes."""
    found = re.findall(rf"{robot}: [^;|]*?(\d+) idle at boundaries[^;|]*?(\d+) episodes", output)
    return found[-1] if found else None


@pytest.mark.timeout(400)
def test_two_robots_across_thirty_resets_never_wait_for_a_lost_answer():
    server_command = python_module(
        "plugrl_ros.tools.test_policy_server",
        *("--port", "0", "--horizon", "10", "--action-dim", "2", "--latency", "0.08", "--jitter", "0.02"),
        *("--stamp-key", "state/joints"),
    )
    robot = python_module("plugrl_ros.demo.robot_node", "--envs", "2", "--mode", "timer", "--rate", "20")
    with process(server_command) as server, process(robot):
        line = wait_until(
            lambda: next((x for x in server.output().splitlines() if x.startswith("listening on")), None),
            60,
            "the policy server listening",
        )
        uri = "ws://127.0.0.1:" + line.rsplit(":", 1)[1]
        bridge = python_module(
            "plugrl_ros.node.bridge_main",
            *("--ros-args", "--params-file", str(DEMO)),
            *("-p", "mode:=deploy", "-p", f"policy.uri:={uri}", "-p", "policy.action_horizon:=10"),
            *("-p", "envs:=['reacher0', 'reacher1']", "-p", "control.mode:=timer", "-p", "control.rate_hz:=20.0"),
            *("-p", "status.log_period_s:=2.0"),
        )
        with process(bridge) as bridged:
            wait_until(
                lambda: (
                    bridged.output().count(" after 60 steps") + bridged.output().count(" terminated after") >= RESETS
                    or bridged.proc.poll() is not None
                ),
                WAIT_S,
                f"{RESETS} episodes ended",
            )
            wait_until(lambda: _status(bridged.output(), "reacher1") is not None, 30, "a status line after them")
            output = bridged.output()
            code = bridged.stop(30)
    assert code == 0, output[-3000:]
    ended = len(re.findall(r"episode \d+ (?:truncated|terminated) after", output))
    assert ended >= RESETS, output[-3000:]
    # the lost answer's signature: a request abandoned after 5 s, and a reconnect
    assert "no answer within" not in output, output[-3000:]
    assert output.count("connected to the policy server") == 2, output[-3000:]
    for robot_name in ("reacher0", "reacher1"):
        idle, _episodes = _status(output, robot_name)
        # a lost answer idles a robot for up to 100 ticks; a slow answer on a loaded host, for a tick or two
        assert int(idle) <= 5, (robot_name, idle, output[-3000:])
