"""PlugRL messages from the trainer's side: what a client sends, checked; what a trainer sends, built.

A check either finds a message unusable and raises :class:`Resync` (a PlugRL
server then closes the connection with ``plugrl-server-resync``), or returns
it typed, with the rules it broke (``violations``: a server resyncs on any)
and the conventions it strayed from (``deviations``: a server accepts them,
a conformance checker reports them). Keeping the two apart lets the demo
trainer accept what PlugRL's own server accepts while the test trainer still
tells a client author everything it did differently. Nothing here knows the
connection's history: the per-connection rules live in
:mod:`plugrl_ros.protocol.trainer_connection`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.messages import ACTION, FEEDBACK, INFER, METADATA, decode_text, int_array, message_type


class Rule(enum.Enum):
    """The group of rules a problem belongs to (a conformance checker reports by group)."""

    FRAME = "frame"  # a text frame
    ENVELOPE = "envelope"  # a frame that does not decode, message_type, the required keys
    ARRAYS = "arrays"  # env_indices, step_ids, reuse, rewards, flags: kind, dtype, shape
    OBSERVATION = "observation"  # images, states, text, and their common leading dimension
    ALTERNATION = "alternation"  # metadata, then infer and feedback in turn
    ENV_SETS = "env-sets"  # which envs may appear in which message
    REUSE = "reuse"  # the reuse-feedback-obs feature
    INFO = "info"  # a feedback's info must split per env


@dataclass(frozen=True)
class Problem:
    """One thing a message did wrong; ``note`` marks a convention even a checker accepts."""

    rule: Rule
    detail: str
    note: bool = False

    def __str__(self) -> str:
        return self.detail


class Resync(ProtocolError):
    """A message the trainer cannot go on from: close 1001 ``plugrl-server-resync``."""

    def __init__(self, problem: Problem, kind: str | None = None) -> None:
        super().__init__(problem.rule.value, problem.detail)
        self.problem = problem
        self.kind = kind  # the message's message_type, when it has a readable one


@dataclass(frozen=True)
class Observation:
    """An observation as sent, with its common leading dimension when it has one."""

    data: Any
    rows: int | None


@dataclass(frozen=True)
class Infer:
    """A checked ``infer``: ``observation`` holds the rows not reused, in order."""

    env_indices: tuple[int, ...]
    step_ids: tuple[int, ...] | None  # None when unusable (a violation says why)
    reuse: tuple[bool, ...] | None  # None when the key is absent
    observation: Observation
    violations: tuple[Problem, ...]
    deviations: tuple[Problem, ...]


@dataclass(frozen=True)
class Feedback:
    """A checked ``feedback``; an unusable array is None (and a violation says why)."""

    env_indices: tuple[int, ...]
    step_ids: tuple[int, ...] | None
    observation: Observation
    rewards: np.ndarray | None  # float64 [m]
    terminated: np.ndarray | None  # bool [m]
    truncated: np.ndarray | None  # bool [m]
    ended: np.ndarray | None  # terminated | truncated, when both are usable
    info: dict
    violations: tuple[Problem, ...]
    deviations: tuple[Problem, ...]


Message = Infer | Feedback


def describe(value: Any) -> str:
    """What a value is, for an error message: its dtype and shape when it is an array."""
    if isinstance(value, np.ndarray):
        return f"a {value.dtype.str} array of shape {list(value.shape)}"
    name = type(value).__name__
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


def decode(frame: bytes | str, expected: str = INFER) -> dict:
    """A client frame as an infer or feedback map (Resync if it is neither); ``expected`` names the wanted one."""
    if isinstance(frame, str):
        raise Resync(Problem(Rule.FRAME, f"a text frame: {frame[:60]!r}"))
    try:
        message = codec.unpackb(frame)
    except ProtocolError as exc:
        # A frame that is not msgpack breaks the envelope; one whose arrays are bad breaks the array rules.
        rule = Rule.ENVELOPE if exc.field == "frame" else Rule.ARRAYS
        raise Resync(Problem(rule, f"does not decode: {exc}")) from None
    kind = message.get("message_type") if isinstance(message, dict) else None
    try:
        message_type(message, kind if kind in (INFER, FEEDBACK) else expected)
    except ProtocolError as exc:
        raise Resync(Problem(Rule.ENVELOPE, str(exc))) from None
    return message


def check_envelope(message: dict) -> None:
    """The keys an infer or a feedback must have (Resync naming the first missing ones)."""
    kind = message["message_type"]
    missing = [key for key in ("data", "env_indices", "step_ids") if key not in message]
    if missing:
        raise Resync(Problem(Rule.ENVELOPE, f"the {kind} has no {', '.join(missing)}"), kind)
    if kind == FEEDBACK:
        data = message["data"]
        if not isinstance(data, dict):
            raise Resync(Problem(Rule.ENVELOPE, f"feedback data must be a map, got {describe(data)}"), kind)
        missing = [key for key in ("obs", "rewards", "terminated", "truncated", "info") if key not in data]
        if missing:
            raise Resync(Problem(Rule.ENVELOPE, f"feedback data has no {', '.join(missing)}"), kind)
        if not isinstance(data["info"], dict):
            raise Resync(
                Problem(Rule.ENVELOPE, f"feedback data.info must be a map, got {describe(data['info'])}"), kind
            )


class _Findings:
    """Problems found while checking one message."""

    def __init__(self) -> None:
        self.violations: list[Problem] = []
        self.deviations: list[Problem] = []

    def violate(self, rule: Rule, detail: str) -> None:
        self.violations.append(Problem(rule, detail))

    def deviate(self, rule: Rule, detail: str, note: bool = False) -> None:
        self.deviations.append(Problem(rule, detail, note))


def _env_indices(message: dict, letter: str) -> tuple[int, ...]:
    value = message["env_indices"]
    if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.kind not in "iu":
        problem = f"env_indices must be a <i8 array of shape [{letter}], got {describe(value)}"
        raise Resync(Problem(Rule.ARRAYS, problem), message["message_type"])
    return tuple(value.tolist())


def _int_array(value: Any, name: str, n: int, found: _Findings) -> tuple[int, ...] | None:
    """A signed int array of shape [n] (``<i8`` by convention), or None with a violation."""
    if not isinstance(value, np.ndarray) or value.dtype.kind != "i" or value.shape != (n,):
        found.violate(Rule.ARRAYS, f"{name} must be a <i8 array of shape [{n}], got {describe(value)}")
        return None
    if value.dtype.str != "<i8":
        found.deviate(Rule.ARRAYS, f"{name} is {describe(value)}, expected <i8 [{n}]")
    return tuple(value.tolist())


def _flags(value: Any, name: str, n: int, found: _Findings) -> np.ndarray | None:
    """A bool array of shape [n] (``|b1``; 0/1 ints are read as bools), or None with a violation."""
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biu" or value.shape != (n,):
        found.violate(Rule.ARRAYS, f"{name} must be a |b1 array of shape [{n}], got {describe(value)}")
        return None
    if value.dtype.str != "|b1":
        found.deviate(Rule.ARRAYS, f"{name} is {describe(value)}, expected |b1 [{n}]")
    return value.astype(bool)


def _rewards(value: Any, m: int, found: _Findings) -> np.ndarray | None:
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f" or value.shape != (m,):
        found.violate(Rule.ARRAYS, f"rewards must be a float array of shape [{m}], got {describe(value)}")
        return None
    rewards = value.astype(np.float64)
    # a Python loop beats a numpy reduction on the few values a feedback holds (this runs on every one)
    if not all(map(math.isfinite, rewards.tolist())):
        found.violate(Rule.ARRAYS, "rewards hold NaN or infinite values")
        return None
    if value.dtype.str != "<f4":
        found.deviate(Rule.ARRAYS, f"rewards arrive as {value.dtype.str}; <f4 is the convention (accepted)", note=True)
    return rewards


_OBSERVATION_KEYS = {"images", "states", "text"}
_GROUPS = (("images", "|u1", 4, "[n, h, w, c]"), ("states", "<f8", 2, "[n, d]"))


def check_observation(obs: Any, found: _Findings) -> Observation:
    """An observation's layout: exactly images, states, text, every array sharing one leading dimension."""
    if not isinstance(obs, dict):
        found.violate(Rule.OBSERVATION, f"the observation must be a map of images, states, text, got {describe(obs)}")
        return Observation(obs, None)
    if obs.keys() != _OBSERVATION_KEYS:
        keys = sorted(str(k) for k in obs)
        found.violate(Rule.OBSERVATION, f"the observation's keys are {keys}, expected exactly images, states, text")
    # (group, name, rows): the names are only formatted when something is wrong (this runs on every message)
    leading: list[tuple[str, Any, int]] = []
    for group, typestr, ndim, layout in _GROUPS:
        arrays = obs.get(group, {})
        if not isinstance(arrays, dict):
            found.violate(Rule.OBSERVATION, f"{group} must be a map of name to array, got {describe(arrays)}")
            continue
        for name, array in arrays.items():
            if not isinstance(array, np.ndarray):
                found.violate(Rule.OBSERVATION, f"{group}[{name!r}] must be a {typestr} array, got {describe(array)}")
                continue
            if array.ndim != ndim or array.dtype.kind not in "biuf":
                found.violate(Rule.OBSERVATION, f"{group}[{name!r}] is {describe(array)}, expected {typestr} {layout}")
            elif array.dtype.str != typestr:
                # PlugRL's server hands observations to the policy unread: another width is the policy's business.
                found.deviate(Rule.OBSERVATION, f"{group}[{name!r}] is {describe(array)}, expected {typestr} {layout}")
            if array.ndim >= 1:
                leading.append((group, name, array.shape[0]))
    if "text" in obs:
        text = obs["text"]
        if isinstance(text, list):
            count: int | None = len(text)
        else:
            count = text.shape[0] if isinstance(text, np.ndarray) and text.ndim == 1 else None
        try:
            if isinstance(text, np.ndarray) and text.shape == (0,) and text.dtype.kind != "U":
                # numpy makes an empty list of str a float array; PlugRL's own checker sends that when every
                # row is reused, and there is no string in it to misread
                found.deviate(Rule.OBSERVATION, f"text is {describe(text)}, expected a <U array or a list of str")
            else:
                decode_text(text, -1 if count is None else count, "text")
        except ProtocolError as exc:
            found.violate(Rule.OBSERVATION, f"{exc} (got {describe(text)})")
        else:
            assert count is not None
            leading.append(("text", None, count))
            if isinstance(text, list):
                found.deviate(
                    Rule.OBSERVATION,
                    "text arrives as a msgpack list of str; the Python reference client sends a <U array",
                    note=True,
                )
    if not leading:
        return Observation(obs, None)
    rows = leading[0][2]
    if any(n != rows for _, _, n in leading):
        shown = {("text" if name is None else f"{group}[{name!r}]"): n for group, name, n in leading}
        found.violate(Rule.OBSERVATION, f"leading dimensions differ: {shown}")
        return Observation(obs, None)
    return Observation(obs, rows)


def _observation(obs: Any, found: _Findings, check: bool) -> Observation:
    return check_observation(obs, found) if check else Observation(obs, None)


def parse_infer(message: dict, observations: bool = True) -> Infer:
    """An enveloped ``infer``, checked on its own (the connection's rules come after)."""
    envs = _env_indices(message, "n")
    n = len(envs)
    found = _Findings()
    if message["env_indices"].dtype.str != "<i8":
        found.deviate(Rule.ARRAYS, f"env_indices is {describe(message['env_indices'])}, expected <i8 [{n}]")
    step_ids = _int_array(message["step_ids"], "step_ids", n, found)
    reuse: tuple[bool, ...] | None = None
    if "reuse" in message:
        flags = _flags(message["reuse"], "reuse", n, found)
        if flags is None:
            # Without usable flags nobody knows which rows data holds.
            raise Resync(found.violations[-1], INFER)
        reuse = tuple(bool(f) for f in flags.tolist())
    observation = _observation(message["data"], found, observations)
    n_data = n - sum(reuse) if reuse is not None else n
    if observation.rows is not None and observation.rows != n_data:
        if reuse is not None:
            found.violate(Rule.REUSE, f"data has {observation.rows} rows, but reuse leaves {n_data} rows not reused")
        else:
            found.violate(Rule.OBSERVATION, f"data has {observation.rows} rows, env_indices has {n}")
    return Infer(envs, step_ids, reuse, observation, tuple(found.violations), tuple(found.deviations))


def parse_feedback(message: dict, observations: bool = True) -> Feedback:
    """An enveloped ``feedback``, checked on its own (the connection's rules come after)."""
    envs = _env_indices(message, "m")
    m = len(envs)
    data = message["data"]
    found = _Findings()
    if message["env_indices"].dtype.str != "<i8":
        found.deviate(Rule.ARRAYS, f"env_indices is {describe(message['env_indices'])}, expected <i8 [{m}]")
    step_ids = _int_array(message["step_ids"], "step_ids", m, found)
    terminated = _flags(data["terminated"], "terminated", m, found)
    truncated = _flags(data["truncated"], "truncated", m, found)
    rewards = _rewards(data["rewards"], m, found)
    observation = _observation(data["obs"], found, observations)
    if observation.rows is not None and observation.rows != m:
        found.violate(Rule.OBSERVATION, f"obs has {observation.rows} rows, env_indices has {m}")
    info = data["info"]
    if not info_splits(info, m):
        found.violate(
            Rule.INFO,
            f"info {_keys(info)} cannot be split per env: no array of length {m} at its top level or one map down",
        )
    return Feedback(
        envs,
        step_ids,
        observation,
        rewards,
        terminated,
        truncated,
        None if terminated is None or truncated is None else terminated | truncated,
        info,
        tuple(found.violations),
        tuple(found.deviations),
    )


def info_splits(info: Mapping, m: int) -> bool:
    """Whether a server can split ``info`` per env: empty, one env, or an array of length m at most one map down.

    PlugRL's server slices info per env along the first length-m array it
    finds there; without one, each env gets a wrong slice, so it resyncs.
    """
    if not info or m == 1:
        return True
    for value in info.values():
        if _length_m(value, m):
            return True
        if isinstance(value, dict) and any(_length_m(inner, m) for inner in value.values()):
            return True
    return False


@dataclass(frozen=True)
class EpisodeCount:
    """One ended episode as the client counted it, from ``info["episode"]``."""

    ret: float  # r: the episode's return
    length: int  # l: its length in control steps (0 when the client sent none)
    success: bool  # s (False when the client sent none)


def episode_counts(info: Any, ended: np.ndarray) -> list[EpisodeCount | None]:
    """Per feedback row, the client's count of the episode it ended (r, l, s), or None.

    PlugRL servers read ``info["episode"]`` only on rows that ended their
    episode and whose ``mask`` is set; so does this. Resync (rule ``info``) if
    it is there but unreadable: not a map, no ``r`` or ``mask``, arrays of
    another length, values that are not numbers, a return that is NaN or
    infinite, a length that is not a whole number of steps.
    """
    m = len(ended)
    episode = info.get("episode") if isinstance(info, dict) else None
    if episode is None:
        return [None] * m
    if not isinstance(episode, dict):
        raise _info_resync(f"info.episode must be a map of r, l, s and mask, got {describe(episode)}")
    try:
        mask = np.asarray(episode["mask"], dtype=bool).reshape(m)
        returns = np.asarray(episode["r"], dtype=np.float64).reshape(m)
        lengths = np.asarray(episode.get("l", np.zeros(m)), dtype=np.float64).reshape(m)
        success = np.asarray(episode.get("s", np.zeros(m)), dtype=bool).reshape(m)
    except (KeyError, ValueError, TypeError, ArithmeticError):
        raise _info_resync(f"info.episode must hold r and mask arrays (and l, s) of {m} numbers") from None
    counts: list[EpisodeCount | None] = []
    for row in range(m):
        if not (ended[row] and mask[row]):
            counts.append(None)
            continue
        ret, length = float(returns[row]), float(lengths[row])
        if not math.isfinite(ret):
            raise _info_resync(f"info.episode.r[{row}] is {ret}: a return must be a finite number")
        if not (math.isfinite(length) and length >= 0 and length == int(length)):
            raise _info_resync(f"info.episode.l[{row}] is {length}: a length is a whole number of steps")
        counts.append(EpisodeCount(ret, int(length), bool(success[row])))
    return counts


def _info_resync(detail: str) -> Resync:
    return Resync(Problem(Rule.INFO, detail), FEEDBACK)


def _length_m(value: Any, m: int) -> bool:
    return isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == m


def _keys(info: Mapping) -> str:
    keys = [str(k)[:32] for k in list(info)[:8]]
    return "{" + ", ".join(keys) + (", ..." if len(info) > 8 else "") + "}"


# -- what a trainer sends --------------------------------------------------------------


def build_metadata(data: Mapping[str, Any]) -> dict:
    """A ``metadata`` message; every key of ``data`` is advisory to the client."""
    return {"message_type": METADATA, "data": dict(data)}


def build_action(env_ids: Sequence[int], action: np.ndarray) -> dict:
    """An ``action`` answering an infer for ``env_ids``: ``action`` is time-major, ``[H, n, *da]``."""
    assert action.ndim >= 2 and action.shape[0] >= 1 and action.shape[1] == len(env_ids), (
        f"an action for {len(env_ids)} envs must be [H, {len(env_ids)}, *da], got {list(action.shape)}"
    )
    return {"message_type": ACTION, "data": {"env_ids": int_array(env_ids), "action": action}}
