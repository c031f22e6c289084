"""The intervention section: a person's command source and takeover rule, checked at startup naming the key."""

from __future__ import annotations

import pytest

from plugrl_ros.params.section import ConfigError
from plugrl_ros.ros.config import check_environment, load_config

pytestmark = [pytest.mark.ros]

MINIMAL = {
    "observations.states.pos.topic": "state",
    "observations.states.pos.type": "std_msgs/Float64MultiArray",
    "actions.arm.topic": "cmd",
    "actions.arm.type": "std_msgs/Float64MultiArray",
    "actions.arm.slice": [0, 2],
}
JOY = {"intervention.source": "joy", "intervention.joy.axes": [1, 0]}


def test_a_joy_maps_one_axis_onto_each_action_value_with_the_declared_defaults():
    person = load_config({**MINIMAL, **JOY, "intervention.joy.scale": [2.0, -1.0]}).intervention
    assert person is not None
    assert (person.axes, person.scale, person.offset) == ((1, 0), (2.0, -1.0), (0.0, 0.0))
    assert (person.takeover, person.joy_topic, person.button, person.max_age_s) == ("button", "joy", 4, 0.5)


def test_without_the_section_there_is_no_person_and_no_key_is_read():
    used: dict = {}
    assert load_config(MINIMAL, used).intervention is None
    assert not [key for key in used if key.startswith("intervention")]


def test_each_actuator_names_the_topic_of_its_own_command():
    person = load_config(
        {**MINIMAL, "intervention.source": "actions", "intervention.takeover": "fresh", "intervention.actions.arm": "x"}
    ).intervention
    assert person is not None and person.action_topics == ("x",) and person.joy_topic == ""


@pytest.mark.parametrize(
    ("extra", "key", "fragment"),
    [
        ({"intervention.source": "pedal"}, "intervention.source", "allowed: joy, actions"),
        ({"intervention.source": "joy"}, "intervention.joy.axes", "required"),
        ({**JOY, "intervention.joy.axes": [1]}, "intervention.joy.axes", "2 axis indices"),
        ({**JOY, "intervention.joy.axes": [1, -1]}, "intervention.joy.axes", "2 axis indices"),
        ({**JOY, "intervention.joy.scale": [1.0]}, "intervention.joy.scale", "expected 2 numbers"),
        ({**JOY, "intervention.takeover": "topic"}, "intervention.topic", "name the std_msgs/Bool"),
        ({**JOY, "intervention.topic": "held"}, "intervention.topic", "only read with takeover topic"),
        ({**JOY, "intervention.max_age_s": 0.0}, "intervention.max_age_s", "greater than 0"),
        ({**JOY, "intervention.joy.button": -1}, "intervention.joy.button", "at least 0"),
        ({**JOY, "control.mode": "lockstep"}, "intervention.source", "control.mode timer"),
        ({**JOY, "actions.arm.scale": [1.0, 0.0]}, "actions.arm.scale", "non-zero"),
        ({"intervention.source": "actions", "intervention.takeover": "fresh"}, "intervention.actions.arm", "required"),
        (
            {"intervention.source": "actions", "intervention.actions.arm": "x", "intervention.actions.leg": "y"},
            "intervention.actions.leg",
            "known keys: arm",
        ),
        (
            {"intervention.source": "actions", "intervention.takeover": "fresh", "intervention.joy.topic": "joy"},
            "intervention.joy",
            "only read with source joy or takeover button",
        ),
        ({**JOY, "intervention.actions.arm": "x"}, "intervention.actions", "only read with source actions"),
        ({**JOY, "envs": ["a", "b"], "intervention.joy.topic": "/joy"}, "intervention.joy.topic", "shared by all 2"),
        ({**JOY, "intervention.deadman": 1}, "intervention.deadman", "unknown key"),
    ],
)
def test_a_bad_intervention_is_refused_naming_the_key(extra, key, fragment):
    with pytest.raises(ConfigError, match=fragment) as error:
        load_config({**MINIMAL, **extra})
    assert error.value.key == key


def test_an_actuator_without_a_slice_cannot_take_a_persons_command():
    whole = {k: v for k, v in MINIMAL.items() if k != "actions.arm.slice"}
    with pytest.raises(ConfigError, match="with interventions") as error:
        load_config({**whole, **JOY, "intervention.joy.axes": []})
    assert error.value.key == "actions.arm.slice"


def test_teleop_mode_needs_a_persons_device_and_no_trainer():
    with pytest.raises(ConfigError, match="mode is teleop") as error:
        load_config({**MINIMAL, "mode": "teleop"})
    assert error.value.key == "intervention.source"
    config = load_config({**MINIMAL, **JOY, "mode": "teleop", "trainer.api_key_env": "NOT_SET_ANYWHERE"})
    check_environment(config, {})  # no link: the trainer's key variable is not needed
