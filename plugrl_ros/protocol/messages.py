"""PlugRL messages: observation batches, the client's builders, the server's validators.

Builders produce the maps that :mod:`plugrl_ros.protocol.codec` serializes;
validators take what the codec decoded and either return a typed value or
raise :class:`ProtocolError` naming the field, so that nothing malformed gets
past this module towards an actuator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from plugrl_ros.protocol.codec import StackedRows
from plugrl_ros.protocol.errors import ProtocolError

METADATA = "metadata"
INFER = "infer"
ACTION = "action"
FEEDBACK = "feedback"

REUSE_FEEDBACK_OBS = "reuse-feedback-obs"
# An advisory metadata key of this package's Gymnasium vector env: it steps every env of the connection
# together, with Gymnasium's same-step or next-step autoreset (other clients ignore it, as every unknown key)
VECTOR_AUTORESET = "vector_autoreset"
VECTOR_AUTORESET_MODES = ("same-step", "next-step")

TextFormat = Literal["array", "list"]


@dataclass(frozen=True)
class ObservationRow:
    """One env's observation: images ``|u1 [h,w,c]``, states ``<f8 [d]``, a text prompt."""

    images: Mapping[str, np.ndarray] = field(default_factory=dict)
    states: Mapping[str, np.ndarray] = field(default_factory=dict)
    text: str = ""


def encode_text(texts: Sequence[str], text_format: TextFormat) -> Any:
    """Text as the Python reference client sends it (a ``<U`` array) or as a list of str."""
    if text_format == "list":
        return list(texts)
    width = max((len(t) for t in texts), default=0)
    return np.array(texts, dtype=f"<U{max(width, 1)}").reshape(len(texts))


def decode_text(value: Any, n: int, where: str) -> list[str]:
    """Both accepted text forms, as a list of ``n`` str."""
    if isinstance(value, np.ndarray) and value.dtype.kind == "U" and value.shape == (n,):
        try:
            return [str(t) for t in value.tolist()]
        except (UnicodeDecodeError, ValueError) as exc:
            raise ProtocolError(where, f"holds invalid UTF-32: {exc}") from None
    if isinstance(value, list) and len(value) == n and all(isinstance(t, str) for t in value):
        return value
    raise ProtocolError(where, f"must be a <U array or a list of str of length {n}")


def batch_rows(rows: Sequence[ObservationRow], text_format: TextFormat, template: ObservationRow | None = None) -> dict:
    """Stack one-env rows into an observation batched along a leading axis (stacked as the codec packs it).

    With no rows, ``template`` gives the names and shapes of the zero-row batch
    (an infer whose every row is reused still sends a well-formed observation).
    """
    shape_of = rows[0] if rows else template
    assert shape_of is not None, "an empty batch needs a template row"
    images = {name: _stack([r.images[name] for r in rows], a, np.uint8) for name, a in shape_of.images.items()}
    states = {name: _stack([r.states[name] for r in rows], a, np.dtype("<f8")) for name, a in shape_of.states.items()}
    return {"images": images, "states": states, "text": encode_text([r.text for r in rows], text_format)}


def _stack(arrays: list[np.ndarray], like: np.ndarray, dtype: Any) -> np.ndarray | StackedRows:
    if arrays and all(a.shape == like.shape for a in arrays):
        # The encoder copies each row straight into the frame (no batch copy first).
        return StackedRows(arrays, np.dtype(dtype))
    out = np.empty((len(arrays), *like.shape), dtype=dtype)
    for i, a in enumerate(arrays):
        out[i] = a
    return out


def int_array(values: Sequence[int]) -> np.ndarray:
    return np.asarray(values, dtype="<i8").reshape(len(values))


def build_infer(
    env_indices: Sequence[int], step_ids: Sequence[int], observation: dict, reuse: Sequence[bool] | None = None
) -> dict:
    """An ``infer`` message; ``reuse`` only when the server offered the feature."""
    message = {
        "message_type": INFER,
        "data": observation,
        "env_indices": int_array(env_indices),
        "step_ids": int_array(step_ids),
    }
    if reuse is not None:
        message["reuse"] = np.asarray(reuse, dtype=np.bool_).reshape(len(reuse))
    return message


def build_feedback(
    env_indices: Sequence[int],
    step_ids: Sequence[int],
    observation: dict,
    rewards: Sequence[float],
    terminated: Sequence[bool],
    truncated: Sequence[bool],
    info: Mapping[str, Any],
) -> dict:
    """A ``feedback`` message: chunk-summed rewards and the flags of the last step that ran."""
    m = len(env_indices)
    return {
        "message_type": FEEDBACK,
        "env_indices": int_array(env_indices),
        "step_ids": int_array(step_ids),
        "data": {
            "obs": observation,
            "rewards": np.asarray(rewards, dtype="<f4").reshape(m),
            "terminated": np.asarray(terminated, dtype=np.bool_).reshape(m),
            "truncated": np.asarray(truncated, dtype=np.bool_).reshape(m),
            "info": dict(info),
        },
    }


def episode_info(
    ended: Sequence[bool], returns: Sequence[float], lengths: Sequence[int], successes: Sequence[bool]
) -> dict:
    """``info`` with ``episode`` = {r, l, s, mask} when a row ends its episode, else ``{}``."""
    if not any(ended):
        return {}
    m = len(ended)
    return {
        "episode": {
            "r": np.asarray(returns, dtype="<f4").reshape(m),
            "l": np.asarray(lengths, dtype="<i8").reshape(m),
            "s": np.asarray(successes, dtype=np.bool_).reshape(m),
            "mask": np.asarray(ended, dtype=np.bool_).reshape(m),
        }
    }


def message_type(message: Any, expected: str) -> None:
    """Check the envelope: a map whose str key ``message_type`` holds ``expected``."""
    if not isinstance(message, dict):
        raise ProtocolError("message", f"must be a map, got {type(message).__name__}")
    if "message_type" not in message:
        if b"message_type" in message:
            raise ProtocolError("message_type", "is a bin key; schema keys must be msgpack str")
        raise ProtocolError("message_type", "is missing")
    value = message["message_type"]
    if not isinstance(value, str):
        raise ProtocolError("message_type", f"must be a str, got {type(value).__name__}")
    if value != expected:
        raise ProtocolError("message_type", f"expected {expected!r}, got {value[:64]!r}")


@dataclass(frozen=True)
class Metadata:
    """What the trainer announced. ``None`` means the trainer did not say (never zero)."""

    raw: Mapping[str, Any]
    protocol_version: int | None = None
    action_horizon: int | None = None
    action_dim: int | None = None
    features: frozenset[str] = frozenset()
    # this package's own advisory key: a synchronous vector env steps every env together ("same-step" or
    # "next-step", Gymnasium's autoreset modes); None: an ordinary trainer
    vector_autoreset: str | None = None
    ignored: tuple[str, ...] = ()  # advisory keys present but malformed, for logging

    def describe(self) -> dict[str, str]:
        """The announced keys worth showing an operator, as short strings."""
        keys = ("server", "server_version", "protocol_version", "algorithm", "policy", "action_horizon", "action_dim")
        shown = {k: str(self.raw[k])[:80] for k in keys if k in self.raw}
        if self.features:
            shown["features"] = ",".join(sorted(self.features))
        if self.vector_autoreset is not None:
            shown[VECTOR_AUTORESET] = self.vector_autoreset
        return shown


def _positive_int(data: Mapping, key: str, ignored: list[str]) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, np.integer):
        value = int(value)
    if type(value) is int and value > 0:
        return value
    ignored.append(key)
    return None


def parse_metadata(message: Any) -> Metadata:
    """Validate a ``metadata`` message; its keys are advisory, so bad ones are ignored, not fatal."""
    message_type(message, METADATA)
    data = message.get("data")
    if not isinstance(data, dict):
        raise ProtocolError("metadata.data", f"must be a map, got {type(data).__name__}")
    ignored: list[str] = []
    features_value = data.get("features", [])
    if isinstance(features_value, (list, tuple)) and all(isinstance(f, str) for f in features_value):
        features = frozenset(features_value)
    else:
        features = frozenset()
        ignored.append("features")
    autoreset = data.get(VECTOR_AUTORESET)
    if autoreset is not None and autoreset not in VECTOR_AUTORESET_MODES:
        ignored.append(VECTOR_AUTORESET)
        autoreset = None
    version = data.get("protocol_version")
    if version is not None and type(version) is not int:
        ignored.append("protocol_version")
        version = None
    return Metadata(
        raw={k: v for k, v in data.items() if isinstance(k, str)},
        protocol_version=version,
        action_horizon=_positive_int(data, "action_horizon", ignored),
        action_dim=_positive_int(data, "action_dim", ignored),
        features=features,
        vector_autoreset=autoreset,
        ignored=tuple(ignored),
    )


@dataclass(frozen=True)
class ActionChunk:
    """A validated ``action``: ``actions[k, row]`` is step k for env ``env_ids[row]``."""

    env_ids: tuple[int, ...]
    actions: np.ndarray  # float64 [H, n, *da], finite, owned

    @property
    def horizon(self) -> int:
        return self.actions.shape[0]


def parse_action(message: Any, env_indices: Sequence[int]) -> ActionChunk:
    """Validate an ``action`` answering an infer for ``env_indices``."""
    message_type(message, ACTION)
    data = message.get("data")
    if not isinstance(data, dict):
        raise ProtocolError("action.data", f"must be a map, got {type(data).__name__}")
    n = len(env_indices)
    if "env_ids" in data:
        env_ids = data["env_ids"]
        if not isinstance(env_ids, np.ndarray) or env_ids.dtype.kind not in "iu" or env_ids.shape != (n,):
            raise ProtocolError("action.data.env_ids", f"must be an int array of shape [{n}]")
        if env_ids.tolist() != list(env_indices):
            raise ProtocolError(
                "action.data.env_ids",
                f"{env_ids.tolist()[:16]} does not match the infer's env_indices {list(env_indices)[:16]} in order",
            )
    if "action" not in data:
        raise ProtocolError("action.data.action", "is missing")
    action = data["action"]
    if not isinstance(action, np.ndarray):
        raise ProtocolError("action.data.action", f"must be an ndarray, got {type(action).__name__}")
    if action.dtype.kind not in "buif":
        raise ProtocolError("action.data.action", f"dtype {action.dtype.str} is not numeric")
    if action.ndim < 2 or action.shape[1] != n:
        raise ProtocolError("action.data.action", f"shape {list(action.shape)} is not [H, {n}, *da]")
    if action.shape[0] < 1:
        raise ProtocolError("action.data.action", "has horizon 0; H must be at least 1")
    actions = action.astype(np.float64)  # a private, writable, native copy
    if not np.isfinite(actions).all():
        raise ProtocolError("action.data.action", "holds NaN or infinite values")
    return ActionChunk(env_ids=tuple(int(e) for e in env_indices), actions=actions)


def action_width(chunk: ActionChunk) -> int:
    """The number of action values per env step (``prod(da)``)."""
    return math.prod(chunk.actions.shape[2:])
