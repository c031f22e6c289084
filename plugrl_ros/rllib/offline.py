"""Recordings as RLlib offline data: ``plugrl-export RECORDING... --to rllib DIR --config robot.yaml``.

RLlib's offline API (``config.offline_data(input_=DIR, input_read_episodes=True)``)
reads episodes stored as RLlib stores them itself: Parquet rows whose ``item``
column holds one ``SingleAgentEpisode``'s state, packed with msgpack and
msgpack-numpy. This module writes recordings in that form, with the spaces the
runner builds from the same params file (:func:`plugrl_ros.serve.spaces.robot_spaces`),
so a module trained on them takes the runner's observations and gives its
actions. One RL step is one chunk of H control steps, as the runner's
(:mod:`plugrl_ros.serve.chunks`):

- a **train** recording's RL steps are its chunks: the observation each was
  inferred from, the chunk as executed (the steps a person commanded hold the
  person's command; a step an idle replaced keeps the chunk's row), the
  reward summed over the steps that ran, and the observation fed back;
- a **teleop** recording's RL steps are H consecutive ticks the person
  commanded: the observation at the first, the person's H commands, the
  rewards summed. Where the person rests the demonstration is cut: the part
  before becomes an episode of its own, truncated.

Every step's infos say ``intervened`` (a person commanded some step of it), as
the runner's do. Actions are stored as the module gives them: normalised into
[-1, 1] where RLlib's ``normalize_actions`` is on (its default; the
module-to-env pipeline unsquashes them), as they are otherwise.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_ros.serve.interventions import INTERVENED
from plugrl_ros.serve.observations import split_rows
from plugrl_ros.serve.spaces import RobotSpaces

OBSERVATION_GROUPS = ("states", "images")
ROWS_PER_FILE = 1000


@dataclass
class RLEpisode:
    """One episode (or a part of one) as RL steps: len(observations) == len(actions) + 1."""

    observations: list[dict[str, dict[str, np.ndarray]]] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)  # [H * action_dim], in action units
    rewards: list[float] = field(default_factory=list)
    intervened: list[bool] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False

    def __len__(self) -> int:
        return len(self.actions)


class Observations:
    """A recording's observation arrays (``observations/<group>/<name>`` [N, ...]) read into the space's rows."""

    def __init__(self, space: gym.spaces.Dict) -> None:
        self.space = space

    def rows(self, arrays: dict[str, np.ndarray], where: str) -> list[dict[str, dict[str, np.ndarray]]]:
        columns: dict[tuple[str, str], np.ndarray] = {}
        n: int | None = None
        for group, inner in self.space.spaces.items():
            for name, box in inner.spaces.items():
                key = f"observations/{group}/{name}"
                if key not in arrays:
                    present = sorted(k.partition("/")[2] for k in arrays if k.startswith("observations/"))
                    raise ValueError(f"{where}: has no {group}/{name}, which the space needs (it has {present})")
                column = arrays[key]
                if column.shape[1:] != box.shape:
                    raise ValueError(
                        f"{where}: {group}/{name} has shape {list(column.shape[1:])}, the space declares "
                        f"{list(box.shape)}: the recording and the params file describe different robots"
                    )
                columns[group, name] = column.astype(box.dtype)
                n = len(column)
        assert n is not None
        return split_rows(columns, self.space.spaces, n)


def train_episodes(arrays: dict[str, np.ndarray], spaces: RobotSpaces, where: str) -> list[RLEpisode]:
    """A train-mode episode's chunks as RL steps (see the module's docstring)."""
    horizon, width = spaces.horizon, spaces.chunks.action_dim
    actions = np.asarray(arrays["actions"], dtype=np.float64)
    if actions.shape[1:] != (horizon, width):
        raise ValueError(
            f"{where}: its chunks are {list(actions.shape[1:])}, the runner's are [{horizon}, {width}] "
            "(--horizon and the params file's actuators)"
        )
    executed = actions.copy()
    intervened = np.zeros(len(actions), dtype=bool)
    if "step_person" in arrays:
        steps = np.cumsum(np.concatenate([[0], arrays["chunk_steps"]]))
        for k in range(len(actions)):
            for row, step in enumerate(range(steps[k], steps[k + 1])):
                if arrays["step_person"][step]:
                    executed[k, row] = arrays["step_person_command"][step]
                    intervened[k] = True
    observations = Observations(spaces.observation_space).rows(arrays, where)
    chunks = len(actions)
    episode = RLEpisode(
        observations=observations[: chunks + 1],
        actions=[a.reshape(-1) for a in executed],
        rewards=[float(r) for r in arrays["rewards"]],
        intervened=intervened.tolist(),
        terminated=bool(arrays["terminated"][-1]),
        truncated=bool(arrays["truncated"][-1]),
    )
    if len(observations) == chunks:  # the last chunk's feedback is not on record: it ends one chunk early
        del episode.actions[-1], episode.rewards[-1], episode.intervened[-1]
        episode.terminated, episode.truncated = False, True
    if not episode.terminated and not episode.truncated:
        episode.truncated = True  # a lost connection ended it: the learner must not bootstrap from nothing
    return [episode] if len(episode) else []


def teleop_episodes(arrays: dict[str, np.ndarray], spaces: RobotSpaces, where: str) -> list[RLEpisode]:
    """A teleop demonstration's person-commanded ticks as RL steps of H ticks (see the module's docstring)."""
    horizon, width = spaces.horizon, spaces.chunks.action_dim
    commands = np.asarray(arrays["step_actions"], dtype=np.float64)
    if commands.shape[1:] != (width,):
        raise ValueError(f"{where}: the person's commands are {list(commands.shape[1:])} wide, the runner's {width}")
    observations = Observations(spaces.observation_space).rows(arrays, where)
    person = np.asarray(arrays["step_person"], dtype=bool) & np.asarray(arrays["step_observed"], dtype=bool)
    rewards = np.asarray(arrays["step_rewards"], dtype=np.float64)
    terminated = np.asarray(arrays["step_terminated"], dtype=bool)
    truncated = np.asarray(arrays["step_truncated"], dtype=bool)
    out: list[RLEpisode] = []
    current = RLEpisode()
    t, ticks = 0, len(commands)

    def cut(next_obs: dict[str, dict[str, np.ndarray]] | None, *, term: bool = False, trunc: bool = True) -> None:
        nonlocal current
        if current.actions:
            if next_obs is None:  # no observation after the last step: it ends one step early
                del current.actions[-1], current.rewards[-1], current.intervened[-1]  # its observation is the last
                term, trunc = False, True
            else:
                current.observations.append(next_obs)
            current.terminated, current.truncated = term, trunc and not term
            if current.actions:
                out.append(current)
        current = RLEpisode()

    while t < ticks:
        if not person[t : t + horizon].all() or t + horizon > ticks:
            cut(observations[t] if person[t] else None)
            t += 1
            continue
        span = slice(t, t + horizon)
        current.observations.append(observations[t])
        current.actions.append(commands[span].reshape(-1))
        current.rewards.append(float(rewards[span].sum()))
        current.intervened.append(True)
        t += horizon
        if terminated[span].any():
            cut(observations[t - 1], term=True)  # a terminal step's next observation is never bootstrapped from
        elif truncated[span].any():
            cut(None)  # no observation after the demonstration's last tick: it ends one step early
    cut(None)
    return out


def rllib_episode(episode: RLEpisode, spaces: RobotSpaces, normalize_actions: bool) -> Any:
    """``episode`` as RLlib's SingleAgentEpisode, its actions as the module gives them."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    from ray.rllib.utils.spaces.space_utils import normalize_action

    action_space = spaces.action_space
    actions = [np.asarray(a, dtype=action_space.dtype) for a in episode.actions]
    if normalize_actions:
        actions = [np.asarray(normalize_action(a, action_space), dtype=action_space.dtype) for a in actions]
    return SingleAgentEpisode(
        id_=uuid.uuid4().hex,
        observations=episode.observations,
        actions=actions,
        rewards=episode.rewards,
        infos=[{}] + [{INTERVENED: flag} for flag in episode.intervened],
        terminated=episode.terminated,
        truncated=episode.truncated,
        observation_space=spaces.observation_space,
        action_space=action_space,
        len_lookback_buffer=0,
    )


def packed(episodes: Iterable[Any]) -> Iterator[bytes]:
    """Each SingleAgentEpisode's state, packed as RLlib packs the episodes it records."""
    import msgpack
    import msgpack_numpy

    for episode in episodes:
        yield msgpack.packb(episode.get_state(), default=msgpack_numpy.encode)


def write_parquet(rows: Iterable[bytes], out_dir: Path, rows_per_file: int = ROWS_PER_FILE) -> int:
    """``rows`` as Parquet files of an ``item`` column under ``out_dir``; the number of rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    written, part, batch = 0, 0, []

    def flush() -> None:
        nonlocal part, batch
        if batch:
            pq.write_table(
                pa.table({"item": pa.array(batch, type=pa.binary())}), out_dir / f"episodes-{part:05d}.parquet"
            )
            part, batch = part + 1, []

    for row in rows:
        batch.append(row)
        written += 1
        if len(batch) >= rows_per_file:
            flush()
    flush()
    return written


@dataclass
class ExportCounts:
    episodes: int = 0  # RLlib episodes written (a demonstration cut where the person rested is several)
    steps: int = 0
    intervened_steps: int = 0
    skipped: list[str] = field(default_factory=list)


def export_rllib(
    recorded: Iterable[tuple[str, dict[str, np.ndarray], str]],
    spaces: RobotSpaces,
    out_dir: Path,
    normalize_actions: bool = True,
) -> ExportCounts:
    """Writes the recorded episodes ``(mode, arrays, where)`` as RLlib offline data under ``out_dir``."""
    counts = ExportCounts()

    def episodes() -> Iterator[Any]:
        for mode, arrays, where in recorded:
            try:
                parts = (teleop_episodes if mode == "teleop" else train_episodes)(arrays, spaces, where)
            except ValueError as exc:
                counts.skipped.append(str(exc))
                continue
            for part in parts:
                counts.episodes += 1
                counts.steps += len(part)
                counts.intervened_steps += sum(part.intervened)
                yield rllib_episode(part, spaces, normalize_actions)

    write_parquet(packed(episodes()), out_dir)
    return counts
