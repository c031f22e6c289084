"""What the node asks of a mode: one interface, so the node never asks which mode it holds.

A mode (train: :class:`plugrl_ros.train.train_mode.TrainMode`; deploy:
:class:`plugrl_ros.deploy.deploy_mode.DeployMode`; teleop, a person and no link:
:class:`plugrl_ros.teleop.teleop_mode.TeleopMode`) owns its link and its
stepping rule and drives the robot side; the node starts and stops it, passes
it the robot side's events, and publishes what it reports. Like RLlib's
``EnvRunner`` for its algorithm, the node is written against this protocol
only.
"""

from __future__ import annotations

from typing import Protocol

from plugrl_ros.robot.status import Entry


class Mode(Protocol):
    """A mode of the bridge, as the node composes it."""

    lockstep: bool  # steps are event-driven (else the control timer publishes one step per tick)
    finished: bool  # the run is over: the node exits with :attr:`exit_code`
    exit_code: int

    def start(self) -> None:
        """Open the link(s); called once, after the node is built."""
        ...

    def stop(self) -> None:
        """Close the link(s) with 1000 (the robot side has idled the actuators)."""
        ...

    def on_input(self, env: int) -> None:
        """A message arrived for ``env``."""
        ...

    def on_pause(self, paused: bool) -> None:
        """The robot side paused or resumed the robots."""
        ...

    def describe(self) -> str:
        """The link, for the startup line: what this mode connects to."""
        ...

    def diagnostics(self, prefix: str) -> list[Entry]:
        """The mode's /diagnostics entries (link, control loop, one per env), names starting with ``prefix``."""
        ...

    def status_line(self) -> str:
        """The periodic one-line status for the log."""
        ...
