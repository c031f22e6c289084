"""Rebuilding a deploy-mode recording's episodes (``plugrl-export`` picks this for a ``mode: deploy`` run).

A deploy run has no trainer to feed back to: what it holds is, per robot,
the observations sent to the policy server, the chunks it answered, and per
control tick the action applied (a chunk's row, or a blend of rows under
``ensemble`` / ``crossfade``), what each actuator was sent, and the step's
reward and flags while an episode ran. Each episode file holds (T steps, K
chunks that ran in it):

- per chunk: ``observations/<images|states>/<name>`` [K] (the observation the
  chunk was computed from), ``actions`` [K, H, *da] as received,
  ``chunk_first_row`` [K] (the row it started from: the ones before were
  meant for ticks that passed while it travelled), ``chunk_steps`` [K];
- per step: ``step_actions`` [T, da] as applied (NaN on an idle step: no
  chunk had a row for it), ``step_idle``, ``step_chunk`` (the index of the
  newest chunk, -1 idle), ``commanded/<sink>`` [T, d] (NaN where nothing was
  published), ``step_rewards``, ``step_terminated``, ``step_truncated``,
  ``step_dones``, ``step_t_ns``;

and ``env``, ``episode_return``, ``episode_length``, ``success``,
``complete`` (false if calls were dropped while it ran), and ``finished``
(false for the episode still running when the recording ended: a deploy run
without episode topics is one such episode, exported all the same).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plugrl_ros.record import channels
from plugrl_ros.record.episode_parts import (
    CallGaps,
    EpisodeArrays,
    episode_or_reason,
    observation_part,
    stack_observations,
)
from plugrl_ros.record.read import Recorded, array, labelled, values


@dataclass
class _Chunk:
    action: np.ndarray
    obs: dict[str, Any] | None
    first_row: int


@dataclass
class _Step:
    t_ns: int
    seq: int
    chunk: _Chunk | None  # None: idle
    action: np.ndarray | None = None
    commanded: dict[str, np.ndarray] = field(default_factory=dict)
    result: dict[str, float] | None = None


@dataclass
class _Episode:
    steps: list[_Step] = field(default_factory=list)
    end: dict[str, float] | None = None
    complete: bool = True


@dataclass
class _Robot:
    index: int
    episode: _Episode = field(default_factory=_Episode)
    obs: dict[str, Any] | None = None  # the last observation sent
    obs_seq: int | None = None  # the call whose parts are being gathered
    received: np.ndarray | None = None  # the last chunk received, until its answer record says what became of it
    chunk: _Chunk | None = None  # the newest applied chunk: a step's action comes from it
    pending: _Step | None = None  # the last step, until its result (or the next step: no episode ran)
    exported: int = 0


class DeployEpisodeAssembler:
    """Rebuilds a deploy recording's episodes from its messages, fed in file order."""

    def __init__(self) -> None:
        self.robots: dict[int, _Robot] = {}
        self.unfinished = 0  # exported, though still running when the recording ended
        self.skipped: list[str] = []
        self._gaps = CallGaps()

    def feed(self, recorded: Recorded) -> Iterator[EpisodeArrays]:
        topic, msg, seq = recorded.topic, recorded.msg, recorded.sequence
        if topic in (channels.CONFIG_TOPIC, channels.RECORDER_TOPIC):
            return
        if self._gaps.gap(seq):
            for robot in self.robots.values():  # calls were dropped; we cannot tell whose
                robot.episode.complete = False
        per_env = channels.split_env_topic(topic)
        if per_env is None:
            if topic == channels.LINK_EVENT_TOPIC and msg.message == "close":
                for index in values(msg).get("dropped_envs", []):
                    robot = self.robots.get(int(index))
                    if robot is not None:
                        robot.chunk = None  # the link's loss dropped it: the next steps idle
            return
        index, rest = per_env
        robot = self.robots.setdefault(index, _Robot(index))
        head, _, name = rest.partition("/")
        if head == "infer":
            if robot.obs_seq != seq:
                robot.obs, robot.obs_seq = {}, seq
            key, value = observation_part(name, recorded)
            assert robot.obs is not None
            robot.obs[key] = value
            return
        robot.obs_seq = None
        episode = robot.episode
        if rest == "action_chunk":
            robot.received = array(msg)
        elif rest == channels.ANSWER:
            fields = values(msg)
            if msg.message == "applied" and robot.received is not None:
                robot.chunk = _Chunk(robot.received, robot.obs, int(fields.get("first_row", 0)))
            robot.received = None
        elif rest == "step":
            idle = bool(labelled(msg)["idle"])
            robot.pending = _Step(recorded.log_time, seq, None if idle else robot.chunk)
        elif rest == channels.APPLIED:
            if robot.pending is not None and robot.pending.seq == seq:
                robot.pending.action = array(msg).ravel()
        elif head == "command":
            if robot.pending is not None and robot.pending.seq == seq:
                robot.pending.commanded[name] = array(msg).ravel()
        elif rest == "step_result":
            step, robot.pending = robot.pending, None
            if step is None:
                episode.complete = False  # its step was dropped
                return
            step.result = labelled(msg)
            episode.steps.append(step)
        elif rest == "episode":
            episode.end = labelled(msg)
            yield from self._close(robot)

    def finish(self) -> Iterator[EpisodeArrays]:
        """The recording ended: an episode still running is exported too, as not finished."""
        for robot in self.robots.values():
            if robot.episode.steps:
                self.unfinished += 1
                yield from self._close(robot)

    def _close(self, robot: _Robot) -> Iterator[EpisodeArrays]:
        episode, robot.episode = robot.episode, _Episode()
        yield from episode_or_reason(_episode_arrays, robot.index, episode, robot.exported, self.skipped)
        robot.exported += 1


def _episode_arrays(env: int, ep: _Episode) -> dict[str, np.ndarray]:
    acting = [s for s in ep.steps if s.chunk is not None and s.action is not None]
    if not acting:
        raise ValueError("no step of it applied an action")
    chunks: list[_Chunk] = []
    for step in acting:
        if not any(step.chunk is c for c in chunks):
            chunks.append(step.chunk)  # type: ignore[arg-type]
    if any(c.obs is None for c in chunks):
        raise ValueError("the observation a chunk was computed from was not recorded")
    out: dict[str, np.ndarray] = {}
    stack_observations([c.obs for c in chunks], "observations", out)  # type: ignore[misc]
    out["actions"] = np.stack([c.action for c in chunks])
    out["chunk_first_row"] = np.array([c.first_row for c in chunks], dtype=np.int64)
    step_chunk = np.array(
        [next((k for k, c in enumerate(chunks) if s.chunk is c), -1) if s.action is not None else -1 for s in ep.steps],
        dtype=np.int64,
    )
    out["chunk_steps"] = np.array([(step_chunk == k).sum() for k in range(len(chunks))], dtype=np.int64)
    width = acting[0].action.shape[0]  # type: ignore[union-attr]
    out["step_actions"] = np.stack([s.action if s.action is not None else np.full(width, np.nan) for s in ep.steps])
    out["step_idle"] = step_chunk < 0
    out["step_chunk"] = step_chunk
    sinks = sorted({name for s in ep.steps for name in s.commanded})
    for sink in sinks:
        size = max(len(s.commanded[sink]) for s in ep.steps if sink in s.commanded)
        out[f"commanded/{sink}"] = np.stack([s.commanded.get(sink, np.full(size, np.nan)) for s in ep.steps])
    results = [s.result for s in ep.steps]
    out["step_rewards"] = np.array([r["reward"] for r in results], dtype=np.float64)  # type: ignore[index]
    out["step_terminated"] = np.array([bool(r["terminated"]) for r in results])  # type: ignore[index]
    out["step_truncated"] = np.array([bool(r["truncated"]) for r in results])  # type: ignore[index]
    out["step_dones"] = out["step_terminated"] | out["step_truncated"]
    out["step_t_ns"] = np.array([s.t_ns for s in ep.steps], dtype=np.int64)
    end = ep.end or {}
    out["env"] = np.array(env)
    out["episode_return"] = np.array(end.get("return", out["step_rewards"].sum()))
    out["episode_length"] = np.array(int(end.get("length", len(ep.steps))))
    out["success"] = np.array(bool(end.get("success", 0.0)))
    out["complete"] = np.array(ep.complete)
    out["finished"] = np.array(ep.end is not None)
    return out
