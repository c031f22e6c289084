"""The probe clauses: what a client did to the probe environment, read from its observations and rewards.

The probe environment's states reveal the client's work: ``t`` counts the
steps of the running episode and ``a`` holds the action applied last, and
every action value names its step, env and dimension. So each feedback shows
whether the chunk ran time-major and in order, whether the reward is the
chunk's sum, whether a terminal step sent its own observation, and each infer
whether a reset (or a reused row) carried the right observation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from plugrl_ros.protocol.server_messages import Feedback, Infer, describe, info_splits
from plugrl_ros.tools.test_trainer.clauses import (
    CHUNK_LENGTH,
    INFO_EPISODE,
    RESET_OBSERVATION,
    REWARD_SUM,
    TERMINAL_OBSERVATION,
    TIME_MAJOR,
)
from plugrl_ros.tools.test_trainer.report import Recorder
from plugrl_ros.tools.test_trainer.settings import probe_episode_length


@dataclass(frozen=True)
class _Held:
    """An env's chunk, from the infer that got it until its feedback."""

    action: np.ndarray  # the whole chunk as sent, as float64 [H, n, d]
    row: int
    t: float | None  # the probe's t in that infer; None when it cannot be known
    infer: int


@dataclass(frozen=True)
class _LastFeedback:
    ended: bool | None  # terminated or truncated; None when the flags were unreadable
    t: float | None


def _whole(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x == math.floor(x)


def _fmt(x: float) -> str:
    return f"{x:g}"


def probe_states(obs: Any, rows: int | None, action_dim: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The probe's t (float64 [rows]) and a (float64 [rows, d]), or None when the observation lacks them."""
    states = obs.get("states") if isinstance(obs, dict) and isinstance(obs.get("states"), dict) else {}
    t, a = states.get("t"), states.get("a")
    if (
        rows is not None
        and isinstance(t, np.ndarray)
        and isinstance(a, np.ndarray)
        and t.dtype.str == "<f8"
        and a.dtype.str == "<f8"
        and t.shape == (rows, 1)
        and a.shape == (rows, action_dim)
    ):
        return t[:, 0].astype(np.float64), a.astype(np.float64)
    return None


class ProbeChecks:
    """One connection's probe clauses; what it remembers goes with the connection."""

    def __init__(self, number: int, rec: Recorder) -> None:
        self.number = number
        self._rec = rec
        self._held: dict[int, _Held] = {}
        self._last: dict[int, _LastFeedback] = {}

    def infer(self, number: int, infer: Infer, action: np.ndarray, t_data: np.ndarray | None) -> None:
        """An infer answered with ``action`` (float64); ``t_data`` is the probe's t of its data rows, if usable."""
        t_rows: list[float | None] = [None] * len(infer.env_indices)
        if t_data is not None:
            t_rows = self._check_reset_observations(number, infer, t_data)
        for row, env in enumerate(infer.env_indices):
            self._held[env] = _Held(action, row, t_rows[row], number)

    def _check_reset_observations(self, number: int, infer: Infer, t_data: np.ndarray) -> list[float | None]:
        """probe.reset-observation for each row; returns each row's t (None where unknowable)."""
        t_rows: list[float | None] = []
        data_row = 0
        for row, env in enumerate(infer.env_indices):
            last = self._last.get(env)
            if infer.reuse is not None and infer.reuse[row]:
                # A reused row's observation is the one its last feedback sent;
                # an illegal reuse was reported as such and leaves t unknown.
                t = last.t if last is not None and last.ended is False else None
            else:
                t = float(t_data[data_row])
                data_row += 1
            t_rows.append(t)
            if t is None:
                continue
            length = probe_episode_length(env)
            where = f"env {env} in infer {number} on connection {self.number}"
            step_id = infer.step_ids[row] if infer.step_ids is not None else None
            if last is None:
                ok = _whole(t) and 0 <= t < length
                detail = f"t {_fmt(t)} on its first infer of this connection, expected a whole t in 0..{length - 1}"
            elif last.ended is None or last.t is None:
                continue
            elif last.ended:
                ok = t == 0 and step_id == 0
                detail = (
                    f"t {_fmt(t)}, step_ids {step_id} after a terminal feedback; "
                    "expected the reset observation t 0 and step_ids 0"
                )
            else:
                ok = t == last.t
                detail = (
                    f"t {_fmt(t)}, but its last feedback reported t {_fmt(last.t)} "
                    "(the observation changed between feedback and infer)"
                )
            if ok:
                self._rec.ok(RESET_OBSERVATION)
            else:
                self._rec.fail(RESET_OBSERVATION, f"{where}: {detail}")
        return t_rows

    def feedback(self, where: str, feedback: Feedback, states: tuple[np.ndarray, np.ndarray] | None) -> None:
        """A feedback; ``states`` are the probe's t and a of its rows, if usable."""
        terminated, truncated = feedback.terminated, feedback.truncated
        if feedback.info:
            self._check_info(where, feedback)
        seen: set[int] = set()
        for row, env in enumerate(feedback.env_indices):
            held = self._held.pop(env, None)
            ended = bool(terminated[row] or truncated[row]) if feedback.ended is not None else None
            t = float(states[0][row]) if states is not None else None
            if env in seen:
                continue
            seen.add(env)
            self._last[env] = _LastFeedback(ended, t)
            if states is not None and ended is not None and feedback.rewards is not None and held is not None:
                assert terminated is not None and truncated is not None and t is not None
                self._check_row(
                    f"env {env} {where}",
                    env,
                    held,
                    t,
                    states[1][row],
                    float(feedback.rewards[row]),
                    bool(terminated[row]),
                    bool(truncated[row]),
                )

    def _check_row(
        self,
        where: str,
        env: int,
        held: _Held,
        t: float,
        a: np.ndarray,
        reward: float,
        terminated: bool,
        truncated: bool,
    ) -> None:
        length = probe_episode_length(env)
        if terminated and t != length:
            hint = " (was the env reset inside its step?)" if t == 0 else ""
            self._rec.fail(
                TERMINAL_OBSERVATION,
                f"{where}: terminated with t {_fmt(t)}, expected the terminal observation t {length}{hint}",
            )
            return  # not the terminal observation: nothing else in this row can be trusted
        if not terminated and t > length:
            self._rec.fail(TERMINAL_OBSERVATION, f"{where}: t {_fmt(t)} ran past the episode's end at t {length}")
            return
        if not terminated and t == length:
            flags = "truncated" if truncated else "neither terminated nor truncated"
            self._rec.fail(
                TERMINAL_OBSERVATION, f"{where}: t reached {length}, the episode's end, but the flags say {flags}"
            )
        else:
            self._rec.ok(TERMINAL_OBSERVATION)
        if held.t is None:
            return
        steps = t - held.t
        horizon = held.action.shape[0]
        if not _whole(t) or not 1 <= steps <= horizon:
            self._rec.fail(
                CHUNK_LENGTH,
                f"{where}: {_fmt(steps)} steps ran (t {_fmt(held.t)} -> {_fmt(t)}), expected 1..{horizon}",
            )
            return
        self._rec.ok(CHUNK_LENGTH)
        s = int(steps)
        if abs(reward - s) <= 1e-4 * s:
            self._rec.ok(REWARD_SUM)
        else:
            hint = " (the last step's reward?)" if reward == 1.0 else ""
            self._rec.fail(REWARD_SUM, f"{where}: reward {_fmt(reward)}, expected the chunk sum {s}.0{hint}")
        expected = held.action[s - 1, held.row]
        if np.allclose(a, expected, rtol=1e-6, atol=1e-6):
            self._rec.ok(TIME_MAJOR)
        else:
            n = held.action.shape[1]
            env_major = held.action.reshape(n, horizon, -1)[held.row, s - 1]
            hint = (
                " (that is an env-major [n, H, d] reading)" if np.allclose(a, env_major, rtol=1e-6, atol=1e-6) else ""
            )
            self._rec.fail(
                TIME_MAJOR,
                f"{where}: a {[_fmt(v) for v in a.tolist()]}, expected action[{s - 1}, row {held.row}] = "
                f"{[_fmt(v) for v in expected.tolist()]}{hint}",
            )

    def _check_info(self, where: str, feedback: Feedback) -> None:
        envs, info = feedback.env_indices, feedback.info
        terminated, truncated = feedback.terminated, feedback.truncated
        m = len(envs)
        problems: list[str] = []
        episode = info.get("episode")
        ended = terminated is not None and truncated is not None and bool((terminated | truncated).any())
        if episode is None and not ended and info_splits(info, m):
            return  # other keys that split per env (a client's info["intervention"]) are legal and ignored
        if not isinstance(episode, dict):
            self._rec.fail(INFO_EPISODE, f"{where}: info is not empty but has no info['episode'] map")
            return
        arrays: dict[str, np.ndarray] = {}
        for key in ("r", "l", "s", "mask"):
            value = episode.get(key)
            if isinstance(value, np.ndarray) and value.shape == (m,) and value.dtype.kind in "biuf":
                arrays[key] = value
            else:
                got = describe(value)
                problems.append(f"info['episode'][{key!r}] must be a numeric array of length {m}, got {got}")
        if "mask" in arrays and terminated is not None and truncated is not None:
            mask = arrays["mask"].astype(bool)
            ended = terminated | truncated
            if not np.array_equal(mask, ended):
                problems.append(f"mask {mask.tolist()} is not terminated|truncated {ended.tolist()}")
            for row in np.flatnonzero(mask & ended):
                env = envs[row]
                if "l" in arrays and terminated[row]:
                    # Compared with the episode's true end rather than the obs's t,
                    # so a wrong terminal obs is reported once, by its own clause.
                    length = float(arrays["l"][row])
                    if length != probe_episode_length(env):
                        problems.append(
                            f"env {env}: l {_fmt(length)}, but its episode ended at t {probe_episode_length(env)}"
                        )
                if "l" in arrays and "r" in arrays:
                    r, length = float(arrays["r"][row]), float(arrays["l"][row])
                    if abs(r - length) > 1e-3 * max(1.0, length):
                        problems.append(
                            f"env {env}: return r {_fmt(r)}, but l {_fmt(length)} steps earn {_fmt(length)}"
                        )
        self._rec.check(INFO_EPISODE, where, problems)
