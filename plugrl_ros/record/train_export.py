"""A train-mode recording rebuilt as episodes: one ``.npz`` per finished episode (``plugrl-export --to npz``).

Each episode file holds two views of the same run (T steps, K chunks):

- per chunk, the transitions the trainer saw: ``observations/<images|states>/<name>`` [K(+1)]
  (the observation each chunk was inferred from, plus the final one fed back),
  ``next_observations/...`` [K] (the observation fed back after the chunk; zeros where
  ``fed_back`` is false: a reconnect dropped it), ``actions`` [K, H, *da] as received,
  ``chunk_steps`` [K] steps of each chunk that ran, ``rewards`` [K] (their sum),
  ``terminated``/``truncated``/``dones``/``fed_back`` [K];
- per step, what the robot did: ``step_actions`` [T, *da] (the chunk row that ran),
  ``commanded/<sink>`` [T, d] (what each actuator was sent after shaping; NaN where it
  published nothing), ``step_rewards``, ``step_terminated``, ``step_truncated``, ``step_t_ns`` [T];
  with a person in the loop who commanded some steps, ``step_person`` [T] and ``step_person_command``
  [T, *da] (the person's command in action units; NaN where the policy's chunk ran);

and ``env``, ``episode_return``, ``episode_length``, ``success``, and ``complete`` (false if
the recorder dropped calls while the episode ran). Idle ticks (no action available) are not
steps of the episode. Episodes still running when the recording ends are not exported.
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
    next_obs: dict[str, Any] | None = None
    dropped: bool = False
    steps: list[int] = field(default_factory=list)  # indices into the episode's steps

    @property
    def closed(self) -> bool:
        return self.next_obs is not None or self.dropped


@dataclass
class _Step:
    t_ns: int
    seq: int
    action: np.ndarray | None
    commanded: dict[str, np.ndarray] = field(default_factory=dict)
    result: dict[str, float] | None = None
    person: bool = False  # with a person in the loop: the person commanded this step
    person_command: np.ndarray | None = None


@dataclass
class _Episode:
    chunks: list[_Chunk] = field(default_factory=list)
    steps: list[_Step] = field(default_factory=list)
    end: dict[str, float] | None = None
    complete: bool = True


@dataclass
class _Env:
    index: int
    episode: _Episode = field(default_factory=_Episode)
    latest_obs: dict[str, Any] | None = None
    obs_key: tuple[str, int] | None = None  # (sent_in, sequence) of the observation being gathered
    obs_parts: dict[str, Any] = field(default_factory=dict)
    pending_step: _Step | None = None
    # a step in flight when a close ended the episode: its result, when it comes, belongs to no exported episode
    detached: bool = False
    exported: int = 0


class EpisodeAssembler:
    """Rebuilds episodes from a recording's messages, fed in file order."""

    def __init__(self) -> None:
        self.envs: dict[int, _Env] = {}
        self.unfinished = 0
        self.abandoned = 0  # episodes a lost connection ended (the trainer forgot them): not exported
        self.skipped: list[str] = []
        self._gaps = CallGaps()

    def feed(self, recorded: Recorded) -> Iterator[EpisodeArrays]:
        topic, msg, log_time, seq = recorded.topic, recorded.msg, recorded.log_time, recorded.sequence
        if topic in (channels.CONFIG_TOPIC, channels.RECORDER_TOPIC):
            return
        if self._gaps.gap(seq):
            for env in self.envs.values():  # calls were dropped; we cannot tell whose
                env.episode.complete = False
        per_env = channels.split_env_topic(topic)
        if per_env is None:
            if topic == channels.LINK_EVENT_TOPIC and msg.message == "close":
                closed = values(msg)
                for index in closed.get("dropped_envs", []):
                    env = self.envs.get(int(index))
                    if env is not None and env.episode.chunks and not env.episode.chunks[-1].closed:
                        env.episode.chunks[-1].dropped = True
                        yield from self._maybe_close(env)
                for index in closed.get("restarted_envs", []):
                    env = self.envs.get(int(index))
                    if env is not None:
                        self._abandon(env)
            return
        index, rest = per_env
        env = self.envs.setdefault(index, _Env(index))
        head, _, name = rest.partition("/")
        if head in channels.SENT_IN:
            key = (head, seq)
            if env.obs_key != key:
                yield from self._finish_obs(env)
                env.obs_key = key
            key, value = observation_part(name, recorded)
            env.obs_parts[key] = value
            return
        yield from self._finish_obs(env)
        episode = env.episode
        if rest == "action_chunk":
            env.detached = False  # a new chunk: a detached step has reported by now, or never will
            if episode.end is not None:  # its last chunk never got a feedback or a drop on record
                yield from self._close(env)
                episode = env.episode
            if env.latest_obs is None:
                episode.complete = False
            episode.chunks.append(_Chunk(array(msg), env.latest_obs))
        elif rest == "step":
            fields = labelled(msg)
            if fields["idle"]:
                # an idle tick (a stale source, say) while a step is in flight does not end that step: its
                # result still comes, and belongs to it
                return
            chunk = episode.chunks[-1] if episode.chunks else None
            k = int(fields["chunk_step"])
            action = chunk.action[k] if chunk is not None and k < len(chunk.action) else None
            env.pending_step = _Step(log_time, seq, action)
        elif head == "command":
            if env.pending_step is not None and env.pending_step.seq == seq:
                env.pending_step.commanded[name] = array(msg).ravel()
        elif rest in (channels.INTERVENTION, channels.PERSON_COMMAND):
            if env.pending_step is not None and env.pending_step.seq == seq:
                if rest == channels.INTERVENTION:
                    env.pending_step.person = bool(labelled(msg)["person"])
                else:
                    env.pending_step.person_command = array(msg).ravel()
        elif rest == "step_result":
            if env.detached:
                env.detached = False
                return
            step, env.pending_step = env.pending_step, None
            if step is None or step.action is None:
                episode.complete = False
                return
            step.result = labelled(msg)
            if episode.chunks:
                episode.chunks[-1].steps.append(len(episode.steps))
            episode.steps.append(step)
        elif rest == "episode":
            episode.end = labelled(msg)
            yield from self._maybe_close(env)

    def finish(self) -> Iterator[EpisodeArrays]:
        """The recording ended: export episodes that ended; count the ones still running."""
        for env in self.envs.values():
            yield from self._finish_obs(env)
            if env.episode.end is not None:
                yield from self._close(env)
            elif env.episode.steps:
                self.unfinished += 1

    def _abandon(self, env: _Env) -> None:
        """A close ended ``env``'s episode before its end: the next connection starts a new one.

        What the episode holds so far is not exported (it has no end), and it
        never joins the next one: no exported episode spans a lost connection.
        """
        if env.episode.end is not None:
            return  # it ended before the close; its last feedback is what the close may have dropped
        if env.episode.steps:
            self.abandoned += 1
        env.episode = _Episode()
        env.latest_obs = None
        if env.pending_step is not None:
            env.pending_step = None
            env.detached = True

    def _finish_obs(self, env: _Env) -> Iterator[EpisodeArrays]:
        if env.obs_key is None:
            return
        sent_in = env.obs_key[0]
        obs, env.obs_parts, env.obs_key = env.obs_parts, {}, None
        env.latest_obs = obs  # a reused row is the feedback's: the next chunk starts from it
        if sent_in == "feedback":
            chunks = env.episode.chunks
            if chunks and not chunks[-1].closed:
                chunks[-1].next_obs = obs
            yield from self._maybe_close(env)

    def _maybe_close(self, env: _Env) -> Iterator[EpisodeArrays]:
        episode = env.episode
        if episode.end is not None and (not episode.chunks or episode.chunks[-1].closed):
            yield from self._close(env)

    def _close(self, env: _Env) -> Iterator[EpisodeArrays]:
        episode, env.episode = env.episode, _Episode()
        env.latest_obs = None  # the next episode starts from its own (post-reset) observation
        yield from episode_or_reason(_episode_arrays, env.index, episode, env.exported, self.skipped)
        env.exported += 1


def _episode_arrays(env: int, ep: _Episode) -> dict[str, np.ndarray]:
    if not ep.chunks or not ep.steps:
        raise ValueError("no chunk or no step of it was recorded")
    if any(c.obs is None for c in ep.chunks):
        raise ValueError("the observation a chunk was inferred from was not recorded")
    out: dict[str, np.ndarray] = {}
    rows = [c.obs for c in ep.chunks]
    last = ep.chunks[-1].next_obs
    stack_observations(rows + ([last] if last is not None else []), "observations", out)  # type: ignore[list-item]
    template = rows[0]
    assert template is not None
    zeros = {k: np.zeros_like(np.asarray(v)) if not isinstance(v, str) else "" for k, v in template.items()}
    stack_observations([c.next_obs if c.next_obs is not None else zeros for c in ep.chunks], "next_observations", out)
    out["actions"] = np.stack([c.action for c in ep.chunks])
    results = [s.result for s in ep.steps]
    assert all(r is not None for r in results)
    step_rewards = np.array([r["reward"] for r in results], dtype=np.float64)  # type: ignore[index]
    step_term = np.array([bool(r["terminated"]) for r in results])  # type: ignore[index]
    step_trunc = np.array([bool(r["truncated"]) for r in results])  # type: ignore[index]
    out["chunk_steps"] = np.array([len(c.steps) for c in ep.chunks], dtype=np.int64)
    out["rewards"] = np.array([step_rewards[c.steps].sum() for c in ep.chunks])
    out["terminated"] = np.array([bool(c.steps) and bool(step_term[c.steps[-1]]) for c in ep.chunks])
    out["truncated"] = np.array([bool(c.steps) and bool(step_trunc[c.steps[-1]]) for c in ep.chunks])
    out["dones"] = out["terminated"] | out["truncated"]
    out["fed_back"] = np.array([c.next_obs is not None for c in ep.chunks])
    out["step_actions"] = np.stack([s.action for s in ep.steps])  # type: ignore[misc]
    sinks = sorted({name for s in ep.steps for name in s.commanded})
    for sink in sinks:
        width = max(len(s.commanded[sink]) for s in ep.steps if sink in s.commanded)
        out[f"commanded/{sink}"] = np.stack([s.commanded.get(sink, np.full(width, np.nan)) for s in ep.steps])
    if any(s.person for s in ep.steps):  # a person commanded some steps: what they commanded
        width = out["step_actions"].shape[1:]
        out["step_person"] = np.array([s.person and s.person_command is not None for s in ep.steps])
        out["step_person_command"] = np.stack(
            [s.person_command if s.person_command is not None else np.full(width, np.nan) for s in ep.steps]
        )
    out["step_rewards"] = step_rewards
    out["step_terminated"] = step_term
    out["step_truncated"] = step_trunc
    out["step_t_ns"] = np.array([s.t_ns for s in ep.steps], dtype=np.int64)
    end = ep.end or {}
    out["env"] = np.array(env)
    out["episode_return"] = np.array(end.get("return", np.nan))
    out["episode_length"] = np.array(int(end.get("length", len(ep.steps))))
    out["success"] = np.array(bool(end.get("success", 0.0)))
    out["complete"] = np.array(ep.complete)
    return out
