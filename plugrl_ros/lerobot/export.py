"""Recordings as a LeRobotDataset: ``plugrl-export RECORDING... --to lerobot --output DIR``.

Every width, name and rate comes from the recording: the frames' shapes from
its first episode, the element names and ``fps`` (``control.rate_hz``) from the
bridge's parameters recorded at its start. ``observation.state`` is the states
in the order of their names (as RLlib's and Gymnasium's flattening orders a
Dict), each a joint state's ``<joint>.<field>`` or ``<state>.<i>``; ``action``'s
names are the actuators' joints or ``<actuator>.<i>``, at their slice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from plugrl_ros.lerobot.dataset import Layout, LeRobotWriter
from plugrl_ros.lerobot.frames import Frames, frames_of
from plugrl_ros.lerobot.names import action_names, fps_of, state_names
from plugrl_ros.lerobot.video import CODECS


@dataclass
class ExportCounts:
    episodes: int = 0  # LeRobot episodes written (a demonstration cut where the person rested is several)
    frames: int = 0
    skipped: list[str] = field(default_factory=list)


def export_lerobot(
    recorded: Iterable[tuple[str, dict[str, np.ndarray], str]],
    parameters: dict[str, Any],
    out: Path,
    task: str | None = None,
    codec: str = "av1",
) -> ExportCounts:
    """Writes the recorded episodes ``(mode, arrays, where)`` as a LeRobotDataset under ``out``. ``task``: every
    frame's task (default: the recording's text observation, which a recording without one must be given).
    ``codec``: the videos' (:data:`~plugrl_ros.lerobot.video.CODECS`), or ``png``: images in the Parquet."""
    counts = ExportCounts()
    fps = fps_of(parameters)
    writer: LeRobotWriter | None = None
    try:
        for mode, arrays, where in recorded:
            try:
                parts = frames_of(mode, arrays)
            except ValueError as exc:
                counts.skipped.append(f"{where}: {exc}")
                continue
            for part in parts:
                if task is not None:
                    part = Frames(part.states, part.images, part.action, part.reward, part.done, [task] * len(part))
                elif not all(part.text):
                    raise ValueError(
                        "the recording has no text observation (observations.text) to take the task from: "
                        "name the task with --task"
                    )
                if writer is None:
                    layout = Layout(
                        fps=fps,
                        state_names={
                            name: state_names(parameters, name, int(np.prod(part.states[name].shape[1:])))
                            for name in sorted(part.states)
                        },
                        action_names=action_names(parameters, part.action.shape[1]),
                        images=sorted(part.images),
                        codec=None if codec == "png" else CODECS[codec],
                    )
                    writer = LeRobotWriter(out, layout)
                try:
                    writer.add(part)
                except ValueError as exc:
                    counts.skipped.append(f"{where}: {exc}")
                    continue
                counts.episodes += 1
                counts.frames += len(part)
    finally:
        if writer is not None:
            writer.close()
    return counts
