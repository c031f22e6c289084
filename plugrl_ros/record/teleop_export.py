"""Rebuilding a teleop-mode recording's demonstrations (``plugrl-export`` picks this for a ``mode: teleop`` run).

A teleop run has no trainer and no policy: per robot and control tick, the
person either commanded the robot (the observation of that moment, the
person's command in action units, what each actuator was sent) or rested
(the actuators idled; the tick still counts in the episode, as the world
moved on). Each step's reward and flags are recorded at the next tick. An
episode begins with the person's first command after a reset. Each episode
file holds (T ticks of the episode):

- ``observations/<images|states>/<name>`` [T] (zeros where the person rested:
  no observation was taken), ``step_observed`` [T];
- ``step_actions`` [T, da]: the person's command (NaN where the person rested),
  ``step_person`` [T], ``commanded/<sink>`` [T, d] (NaN where nothing was
  published), ``step_rewards``, ``step_terminated``, ``step_truncated``,
  ``step_t_ns``;

and ``env``, ``episode_return``, ``episode_length``, ``success`` and ``complete``
(false if calls were dropped while it ran). Ticks on which the robot could not
move (paused, a stale sensor, resetting) are not steps of the episode.
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
from plugrl_ros.record.read import Recorded, array, labelled


@dataclass
class _Tick:
    t_ns: int
    seq: int
    obs: dict[str, Any] | None
    person: bool = False
    command: np.ndarray | None = None
    commanded: dict[str, np.ndarray] = field(default_factory=dict)
    result: dict[str, float] | None = None


@dataclass
class _Episode:
    ticks: list[_Tick] = field(default_factory=list)
    end: dict[str, float] | None = None
    complete: bool = True


@dataclass
class _Env:
    index: int
    episode: _Episode = field(default_factory=_Episode)
    obs_seq: int | None = None
    obs_parts: dict[str, Any] = field(default_factory=dict)
    observed: dict[str, Any] | None = None  # the observation the next step's command answers
    pending: _Tick | None = None  # the step being gathered (its messages share one sequence number)
    exported: int = 0


class TeleopEpisodeAssembler:
    """Rebuilds the demonstrations of a teleop recording from its messages, fed in file order."""

    def __init__(self) -> None:
        self.envs: dict[int, _Env] = {}
        self.unfinished = 0
        self.skipped: list[str] = []
        self._gaps = CallGaps()

    def feed(self, recorded: Recorded) -> Iterator[EpisodeArrays]:
        topic, msg, seq = recorded.topic, recorded.msg, recorded.sequence
        if topic in (channels.CONFIG_TOPIC, channels.RECORDER_TOPIC):
            return
        if self._gaps.gap(seq):
            for env in self.envs.values():  # calls were dropped; we cannot tell whose
                env.episode.complete = False
        per_env = channels.split_env_topic(topic)
        if per_env is None:
            return
        index, rest = per_env
        env = self.envs.setdefault(index, _Env(index))
        head, _, name = rest.partition("/")
        if head in channels.SENT_IN:
            if env.obs_seq != seq:
                self._finish_obs(env)
                env.obs_seq = seq
            key, value = observation_part(name, recorded)
            env.obs_parts[key] = value
            return
        self._finish_obs(env)
        if env.pending is not None and env.pending.seq != seq:
            self._finish_tick(env)
        if rest == "step":
            env.pending = _Tick(recorded.log_time, seq, None)
        elif env.pending is not None and env.pending.seq == seq:
            if rest == channels.INTERVENTION:
                env.pending.person = bool(labelled(msg)["person"])
                resting = bool(labelled(msg)["replaced"]) and not env.pending.person
                env.pending.result = None if env.pending.person or resting else {"not a step": 1.0}
            elif rest == channels.PERSON_COMMAND:
                env.pending.command = array(msg).ravel()
            elif head == "command":
                env.pending.commanded[name] = array(msg).ravel()
        elif rest == "step_result":
            ticks = env.episode.ticks
            if ticks and ticks[-1].result is None:
                ticks[-1].result = labelled(msg)
            else:
                env.episode.complete = False  # a result for a step that is not on record
        elif rest == "episode":
            env.episode.end = labelled(msg)
            yield from self._close(env)

    def finish(self) -> Iterator[EpisodeArrays]:
        """The recording ended: count the demonstration still running (it has no end: not exported)."""
        for env in self.envs.values():
            self._finish_obs(env)
            if env.pending is not None:
                self._finish_tick(env)
            if any(t.person for t in env.episode.ticks):
                self.unfinished += 1
        return iter(())

    def _finish_obs(self, env: _Env) -> None:
        if env.obs_seq is not None:
            env.observed, env.obs_parts, env.obs_seq = env.obs_parts, {}, None

    def _finish_tick(self, env: _Env) -> None:
        """The step gathered is whole: a person's step (the observation it answered), a rest within an
        episode, or a tick that is no step (before the episode's first command, or the robot unable to move)."""
        tick, env.pending = env.pending, None
        assert tick is not None
        if tick.result is not None:  # marked "not a step": paused, stale or resetting
            return
        episode = env.episode
        if tick.person:
            tick.obs, env.observed = env.observed, None
            if tick.obs is None:
                episode.complete = False
        elif not any(t.person for t in episode.ticks):
            return  # resting before the episode's first command
        episode.ticks.append(tick)

    def _close(self, env: _Env) -> Iterator[EpisodeArrays]:
        episode, env.episode = env.episode, _Episode()
        if not episode.ticks:
            return
        yield from episode_or_reason(_episode_arrays, env.index, episode, env.exported, self.skipped, "demonstration")
        env.exported += 1


def _episode_arrays(env: int, ep: _Episode) -> dict[str, np.ndarray]:
    ticks = [t for t in ep.ticks if t.result is not None]
    if len(ticks) < len(ep.ticks):
        ep.complete = False  # a step whose result is not on record: the episode ends before it
        ticks = ep.ticks[: next(i for i, t in enumerate(ep.ticks) if t.result is None)]
    observed = [t for t in ticks if t.obs is not None]
    commands = [t.command for t in ticks if t.command is not None]
    if not observed or not commands:
        raise ValueError("no step the person commanded is on record")
    template: dict[str, Any] = observed[0].obs  # type: ignore[assignment]
    zeros = {k: np.zeros_like(np.asarray(v)) if not isinstance(v, str) else "" for k, v in template.items()}
    out: dict[str, np.ndarray] = {}
    stack_observations([t.obs if t.obs is not None else zeros for t in ticks], "observations", out)
    out["step_observed"] = np.array([t.obs is not None for t in ticks])
    width = len(commands[0])
    out["step_actions"] = np.stack([t.command if t.command is not None else np.full(width, np.nan) for t in ticks])
    out["step_person"] = np.array([t.person for t in ticks])
    for sink in sorted({name for t in ticks for name in t.commanded}):
        size = max(len(t.commanded[sink]) for t in ticks if sink in t.commanded)
        out[f"commanded/{sink}"] = np.stack([t.commanded.get(sink, np.full(size, np.nan)) for t in ticks])
    results: list[dict[str, float]] = [t.result for t in ticks]  # type: ignore[misc]
    out["step_rewards"] = np.array([r["reward"] for r in results], dtype=np.float64)
    out["step_terminated"] = np.array([bool(r["terminated"]) for r in results])
    out["step_truncated"] = np.array([bool(r["truncated"]) for r in results])
    out["step_t_ns"] = np.array([t.t_ns for t in ticks], dtype=np.int64)
    end = ep.end or {}
    out["env"] = np.array(env)
    out["episode_return"] = np.array(end.get("return", np.nan))
    out["episode_length"] = np.array(int(end.get("length", len(ticks))))
    out["success"] = np.array(bool(end.get("success", 0.0)))
    out["complete"] = np.array(ep.complete)
    return out
