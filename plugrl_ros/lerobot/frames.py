"""A recorded episode as LeRobot frames: one frame per control step whose observation is on record.

A LeRobot frame pairs the observation of a control step with the action the
actuators were then commanded, and that step's reward and end. A recording
holds exactly that where the bridge observed every step it commanded:

- a **teleop** recording: every step the person commanded (the observation it
  answered, the person's command). Where the person rested no observation was
  taken and nothing was commanded, so the demonstration is cut there: each run
  of commanded steps becomes an episode of its own;
- a **train** recording whose chunks are one step long (H = 1): every step,
  with the observation its chunk was inferred from and the chunk's action, or
  the person's command on the steps a person commanded (as the RLlib export
  does). A chunk that never ran cuts the episode.

With H > 1 (and in deploy mode, whose observations are the policy server's
requests) the bridge records one observation per chunk, not per step: such a
recording has no LeRobot frames, and the export says so rather than invent them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Frames:
    """One LeRobot episode: T frames, in the recording's units."""

    states: dict[str, np.ndarray]  # name -> [T, d]
    images: dict[str, np.ndarray]  # name -> [T, h, w, c] uint8
    action: np.ndarray  # [T, da]: what the actuators were commanded (before shaping)
    reward: np.ndarray  # [T]: the step's reward
    done: np.ndarray  # [T]: the step ended the episode (terminated or truncated)
    text: list[str]  # [T]: the text observation ("" where there is none)

    def __len__(self) -> int:
        return len(self.action)


def _observations(arrays: dict[str, np.ndarray], rows: np.ndarray) -> tuple[dict, dict, list[str]]:
    states = {
        k.rpartition("/")[2]: np.asarray(v)[rows] for k, v in arrays.items() if k.startswith("observations/states/")
    }
    images = {
        k.rpartition("/")[2]: np.asarray(v)[rows] for k, v in arrays.items() if k.startswith("observations/images/")
    }
    text = [str(t) for t in np.asarray(arrays["observations/text"])[rows]] if "observations/text" in arrays else []
    return states, images, text or [""] * len(rows)


def _runs(keep: np.ndarray) -> list[np.ndarray]:
    """The indices of each run of consecutive True values in ``keep``."""
    where = np.flatnonzero(keep)
    return [run for run in np.split(where, np.flatnonzero(np.diff(where) != 1) + 1) if len(run)]


def teleop_frames(arrays: dict[str, np.ndarray]) -> list[Frames]:
    """A teleop demonstration's commanded steps, cut where the person rested (see the module's docstring)."""
    person = np.asarray(arrays["step_person"], dtype=bool) & np.asarray(arrays["step_observed"], dtype=bool)
    done = np.asarray(arrays["step_terminated"], dtype=bool) | np.asarray(arrays["step_truncated"], dtype=bool)
    out = []
    for steps in _runs(person):
        states, images, text = _observations(arrays, steps)
        action = np.asarray(arrays["step_actions"], dtype=np.float64)[steps]
        reward = np.asarray(arrays["step_rewards"], dtype=np.float64)[steps]
        out.append(Frames(states, images, action, reward, done[steps], text))
    return out


def train_frames(arrays: dict[str, np.ndarray]) -> list[Frames]:
    """A train episode's steps, each with its chunk's observation (H = 1 only; see the module's docstring)."""
    horizon = int(np.asarray(arrays["actions"]).shape[1])
    if horizon != 1:
        raise ValueError(
            f"its chunks are H = {horizon} steps, and the bridge records one observation per chunk: LeRobot frames "
            "need one per control step (record with chunks of one step, or in teleop mode)"
        )
    chunk_steps = np.asarray(arrays["chunk_steps"])
    first_step = np.concatenate([[0], np.cumsum(chunk_steps)[:-1]])
    action = np.asarray(arrays["step_actions"], dtype=np.float64).reshape(len(arrays["step_actions"]), -1).copy()
    if "step_person" in arrays:
        person = np.asarray(arrays["step_person"], dtype=bool)
        action[person] = np.asarray(arrays["step_person_command"], dtype=np.float64).reshape(len(action), -1)[person]
    done = np.asarray(arrays["step_terminated"], dtype=bool) | np.asarray(arrays["step_truncated"], dtype=bool)
    reward = np.asarray(arrays["step_rewards"], dtype=np.float64)
    out = []
    for chunks in _runs(chunk_steps == 1):
        steps = first_step[chunks]
        states, images, text = _observations(arrays, chunks)
        out.append(Frames(states, images, action[steps], reward[steps], done[steps], text))
    return out


def frames_of(mode: str, arrays: dict[str, np.ndarray]) -> list[Frames]:
    """The LeRobot episodes of one recorded episode of a bridge in ``mode`` (ValueError: it has none)."""
    if mode == "teleop":
        return teleop_frames(arrays)
    if mode == "train":
        return train_frames(arrays)
    raise ValueError(
        f"a {mode}-mode recording holds the observations sent to the policy server, one per chunk, not one per "
        "control step: it has no LeRobot frames (export train or teleop recordings, or --to npz for this one)"
    )
