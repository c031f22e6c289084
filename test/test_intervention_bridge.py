"""A person in the loop, end to end: the bridge process, a fake robot and a gamepad (sensor_msgs/Joy) over real DDS.

The trainer answers every observation with a command that names it (``1000 +``
the robot's state counter), so each command the robot receives says which
observation its chunk was computed for. The person's commands are negative, so
who commanded each message is plain.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import Twist
from harness import STATE, bridge, bridge_params, env_status, wait_until
from sensor_msgs.msg import Joy
from std_msgs.msg import Float64MultiArray
from trainer_fixture import ScriptedTrainer

from plugrl_ros.record.read import array, labelled, read_all

pytestmark = [pytest.mark.ros, pytest.mark.websockets_incidental, pytest.mark.slow, pytest.mark.timeout(120)]

HORIZON = 10  # 0.2 s per chunk at 50 Hz: a person takes over and lets go in the middle of one
BUTTON = 2
MAX_AGE = 0.3
LIMIT = 3.0  # the actuator's min/max: the person's command is clipped like the policy's would be


def joy(axis: float, held: bool) -> Joy:
    buttons = [0] * 4
    buttons[BUTTON] = int(held)
    return Joy(axes=[0.0, axis], buttons=buttons)


def person_share(inbox) -> tuple[str, int, str] | None:
    """The env's (commanded by, person steps, intervention share) on the last /diagnostics while a person drove."""
    for msg in reversed(inbox.msgs()):
        _, _, values = env_status(msg, 0)
        if values.get("commanded by") == "person":
            return values["commanded by"], int(values["person steps"]), values["intervention share"]
    return None


def policy_values(values: list[float]) -> list[float]:
    return [v for v in values if v >= 1000.0]


@pytest.fixture
def counter_robot(robot):
    """The fake robot: a state counter at 100 Hz, the actuator's commands, and a gamepad at 20 Hz (off)."""
    count = [0]  # count[k]: time.monotonic() at which state k + 1 was published

    def state() -> Float64MultiArray:
        count.append(time.monotonic())
        count[0] += 1
        return Float64MultiArray(data=[float(count[0])])

    robot.stream(Float64MultiArray, "/state", state, period_s=0.01)
    cmd = robot.listen(Float64MultiArray, "/cmd")
    pad = robot.stream(Joy, "/joy", lambda: joy(0.0, False), period_s=0.05)
    pad.on = False
    return robot, count, cmd, pad


def test_a_held_deadman_drives_the_robot_a_silent_device_idles_it_and_release_waits_for_a_fresh_chunk(
    tmp_path, counter_robot
):
    robot, count, cmd, pad = counter_robot
    params = bridge_params(
        "",
        observations=STATE,
        actions={
            "cmd": {
                "topic": "cmd",
                "type": "std_msgs/Float64MultiArray",
                "slice": [0, 1],
                "idle": "zero",
                "min": -LIMIT,
                "max": 10000.0,
            }
        },
        intervention={
            "source": "joy",
            "takeover": "button",
            "max_age_s": MAX_AGE,
            "joy": {"topic": "/joy", "axes": [1], "scale": -10.0, "button": BUTTON},
        },
        record={"path": str(tmp_path / "recording"), "flush_interval_s": 0.2},
    )
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")

    def answer(envs, steps, obs):
        del steps
        counter = obs["states"]["pos"][:, 0]
        return np.broadcast_to(1000.0 + counter, (HORIZON, len(envs))).reshape(HORIZON, len(envs), 1).astype("<f4")

    def values(since: float) -> list[float]:
        return [m.data[0] for m in cmd.msgs(since)]

    with ScriptedTrainer({"action_horizon": HORIZON, "action_dim": 1}, answer) as trainer:
        params["trainer"]["uri"] = trainer.uri
        with bridge(tmp_path, params):
            t0 = time.monotonic()
            wait_until(lambda: len(policy_values(values(t0))) >= 20, 30, "the policy driving the robot")

            def take_over() -> None:
                """The person holds the deadman and pushes the stick: -10 per unit, clipped to the actuator's min."""
                pad.make = lambda: joy(1.0, True)
                pad.on = True
                t_hold = time.monotonic()
                wait_until(lambda: values(t_hold).count(-LIMIT) >= 20, 10, "the person's clipped command")
                held = values(t_hold)
                after_first = held[held.index(-LIMIT) :]
                assert set(after_first) == {-LIMIT}, f"the policy commanded while the person held: {after_first}"

            def let_go(idle: bool = True) -> None:
                """Idle until a chunk computed after the release drives again; never one computed before.
                (``idle``: the robot was driven until now; after a silence it was idle all along.)"""
                pad.make = lambda: joy(1.0, False)
                pad.on = True
                t_release = time.monotonic()
                wait_until(lambda: len(policy_values(values(t_release))) >= 20, 20, "the policy driving again")
                timed = [(t, m.data[0]) for t, m in cmd.timed(t_release)]
                released = [v for _, v in timed]
                first_policy = next(i for i, v in enumerate(released) if v >= 1000.0)
                if idle:
                    assert 0.0 in released[:first_policy], "the robot did not idle between the person and the policy"
                assert set(released[:first_policy]) <= {0.0, -LIMIT}
                last_person = max((t for t, v in timed if v == -LIMIT), default=t_release)
                assert -LIMIT not in released[first_policy:], "the person's command outlived the release"
                # Each policy command names the state its chunk was computed for. One published well before the
                # person's last command reached the robot was observed while the person still drove it.
                stale = [v for v in policy_values(released) if count[int(v - 1000.0)] < last_person - 0.03]
                assert not stale, f"a chunk computed before the release ran after it: {stale[:5]}"

            take_over()
            # /diagnostics says who commands the env and the person's share of its steps
            wait_until(lambda: person_share(diagnostics) is not None, 10, "the person on /diagnostics")
            commanded_by, person_steps, share = person_share(diagnostics)
            assert commanded_by == "person" and person_steps > 0 and share.endswith("%") and share != "0%"
            let_go()

            take_over()
            # The gamepad goes silent with the deadman held: the robot idles, the policy does not take over.
            pad.on = False
            t_silent = time.monotonic()
            wait_until(lambda: values(t_silent).count(0.0) >= 40, 10, "idle commands while the device is silent")
            silent = values(t_silent)
            after_idle = silent[silent.index(0.0) :]
            assert set(after_idle) == {0.0}, f"a silent held device let something else command: {after_idle}"
            assert set(silent[: silent.index(0.0)]) <= {-LIMIT}
            let_go(idle=False)

        feedbacks = trainer.messages("feedback")
    intervened = [f["data"]["info"]["intervention"] for f in feedbacks]
    assert all(i["active"].shape == (1, HORIZON) and i["action"].shape == (1, HORIZON, 1) for i in intervened)
    person = [i for i in intervened if i["active"].any()]
    assert person, "no feedback said a person commanded"
    executed = np.concatenate([i["action"][i["active"]] for i in person]).ravel()
    # what ran instead of the chunk: the person's command as clipped, or the idle while nobody could command
    assert set(executed.tolist()) <= {-LIMIT, 0.0} and -LIMIT in executed and 0.0 in executed
    policy = np.concatenate([i["action"][~i["active"]] for i in intervened]).ravel()
    assert (policy[policy != 0.0] >= 1000.0).all(), "a step the policy ran is not said to be its own"

    # The recording holds, at every step, whether a person commanded it and whether the policy's action ran,
    # and the person's command (action units, before the actuator's limits) on each of theirs.
    files = sorted((tmp_path / "recording").glob("*.mcap"))
    flags, commands, sent = [], [], []
    for _, recorded in read_all(files):
        if recorded.topic == "/plugrl/env0/intervention":
            flags.append(labelled(recorded.msg))
        elif recorded.topic == "/plugrl/env0/person_command":
            commands.append(array(recorded.msg).tolist())
        elif recorded.topic.startswith("/plugrl/env0/command/"):
            sent.append(array(recorded.msg).tolist())
    assert len(flags) == len(sent)  # every step recorded says who commanded it (idle zero: every step sends)
    person = [f for f in flags if f["person"]]
    assert person and all(f["replaced"] for f in person)
    assert len(commands) == len(person) and set(map(tuple, commands)) == {(-10.0,)}
    assert any(f["replaced"] and not f["person"] for f in flags), "the idles while nobody could command"
    assert any(not f["replaced"] for f in flags), "the policy's steps"


def test_a_teleop_twist_in_the_actuators_own_type_takes_over_while_fresh_and_is_fed_back_as_executed(tmp_path, robot):
    """Source actions, takeover fresh: a teleop node's Twist (the actuator's own type) is mapped back through the
    actuator's scale into an action, shaped like the policy's (clipped), and fed back as what executed."""
    robot.stream(Float64MultiArray, "/state", lambda: Float64MultiArray(data=[0.0]), period_s=0.02)
    cmd = robot.listen(Twist, "/cmd_vel")
    teleop = robot.stream(Twist, "/teleop/cmd_vel", lambda: _twist(0.25, 1.0), period_s=0.05)
    teleop.on = False
    params = bridge_params(
        "",
        observations=STATE,
        actions={
            "base": {
                "topic": "cmd_vel",
                "type": "geometry_msgs/Twist",
                "fields": ["linear.x", "angular.z"],
                "scale": [0.5, 2.0],
                "min": [-0.2, -2.0],
                "max": [0.2, 2.0],
                "idle": "zero",
            }
        },
        intervention={
            "source": "actions",
            "takeover": "fresh",
            "max_age_s": 0.3,
            "actions": {"base": "/teleop/cmd_vel"},
        },
    )
    minus_one = lambda envs, steps, obs: -np.ones((5, len(envs), 2), dtype="<f4")  # noqa: E731

    def sent(since: float) -> list[tuple[float, float]]:
        return [(round(m.linear.x, 6), round(m.angular.z, 6)) for m in cmd.msgs(since)]

    with ScriptedTrainer({"action_horizon": 5, "action_dim": 2}, minus_one) as trainer:
        params["trainer"]["uri"] = trainer.uri
        with bridge(tmp_path, params):
            t0 = time.monotonic()
            wait_until(lambda: sent(t0).count((-0.2, -2.0)) >= 10, 30, "the policy's command, clipped")
            teleop.on = True
            t_teleop = time.monotonic()
            wait_until(lambda: sent(t_teleop).count((0.2, 1.0)) >= 15, 10, "the teleop command, clipped")
            seen = sent(t_teleop)
            assert set(seen[seen.index((0.2, 1.0)) :]) == {(0.2, 1.0)}
            teleop.on = False
            t_stop = time.monotonic()
            wait_until(lambda: sent(t_stop).count((-0.2, -2.0)) >= 10, 10, "the policy again")
            seen = sent(t_stop)
            assert (0.0, 0.0) in seen[: seen.index((-0.2, -2.0))], "no idle between the teleop and the policy"
        feedbacks = trainer.messages("feedback")
    person = [f["data"]["info"]["intervention"] for f in feedbacks if f["data"]["info"]["intervention"]["active"].any()]
    executed = {tuple(np.round(row.astype(np.float64), 5).tolist()) for i in person for row in i["action"][i["active"]]}
    # the teleop's (0.25, 1.0) in action units is (0.5, 0.5); clipped to (0.2, 1.0) it executed (0.4, 0.5)
    assert (0.4, 0.5) in executed and executed <= {(0.4, 0.5), (0.0, 0.0)}


def _twist(linear_x: float, angular_z: float) -> Twist:
    msg = Twist()
    msg.linear.x = linear_x
    msg.angular.z = angular_z
    return msg
