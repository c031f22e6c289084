"""What a LeRobot dataset's features are called and how fast its frames come, from the recorded parameters:
``fps`` is the bridge's ``control.rate_hz``; a joint state's elements are ``<joint>.<field>``, any other state's
``<state>.<i>``; an action's are its actuators' joints or ``<actuator>.<i>``, at their slices."""

from __future__ import annotations

from typing import Any


def fps_of(parameters: dict[str, Any]) -> int:
    """LeRobot's ``fps`` (a whole number): the bridge's control rate."""
    rate = float(parameters.get("control.rate_hz", 0.0))
    if rate <= 0 or rate != round(rate):
        raise ValueError(
            f"the recording's control.rate_hz is {rate}: a LeRobot dataset's fps is a whole number of frames per second"
        )
    return round(rate)


def state_names(parameters: dict[str, Any], name: str, width: int) -> list[str]:
    """The names of a state's ``width`` elements: ``<joint>.<field>`` for a joint state (fields outer, as the
    source concatenates them), else ``<name>.<i>``."""
    joints = parameters.get(f"observations.states.{name}.joints")
    fields = parameters.get(f"observations.states.{name}.fields", ["position"])
    if joints and len(joints) * len(fields) == width:
        return [f"{joint}.{f}" for f in fields for joint in joints]
    return [f"{name}.{i}" for i in range(width)]


def action_names(parameters: dict[str, Any], width: int) -> list[str]:
    """The names of an action's ``width`` elements, from each actuator's slice (and joints, if it names them)."""
    names = [f"action.{i}" for i in range(width)]
    sinks = sorted({key.split(".")[1] for key in parameters if key.startswith("actions.") and key.count(".") >= 2})
    for sink in sinks:
        where = parameters.get(f"actions.{sink}.slice")
        if not where or len(where) != 2 or not 0 <= where[0] <= where[1] <= width:
            continue
        joints = parameters.get(f"actions.{sink}.joints") or []
        size = where[1] - where[0]
        names[where[0] : where[1]] = list(joints) if len(joints) == size else [f"{sink}.{i}" for i in range(size)]
    if len(set(names)) != len(names):  # two actuators naming the same joint: keep the names apart
        names = [f"action.{i}.{n}" for i, n in enumerate(names)]
    return names
