"""The recording's channels: topic names, message types, and the messages each recorded event becomes.

One table, used by the writer (event -> messages) and by the readers
(topic -> meaning), so the two cannot drift apart. Every message is a plain
dict in the shape of its ROS 2 type, which mcap-ros2-support encodes to CDR.

- ``/plugrl/config`` (std_msgs/String): JSON {parameters, versions}, at the start.
- ``/plugrl/env<i>/<infer|feedback>/images/<name>`` (sensor_msgs/Image; sensor_msgs/CompressedImage
  when ``record.image_format`` is jpeg or png): an observation image as sent (RGB, RGBA or mono).
- ``/plugrl/env<i>/<infer|feedback>/states/<name>`` (std_msgs/Float64MultiArray, dim label = name):
  a state row as sent.
- ``/plugrl/env<i>/<infer|feedback>/text`` (std_msgs/String): the prompt, when not empty.
- ``/plugrl/env<i>/action_chunk`` (Float64MultiArray, dims ``step``, ``action``): the env's chunk
  ``[H, *da]`` as received.
- ``/plugrl/env<i>/step`` (Float64MultiArray ``chunk_step,idle``): which chunk step ran (-1: idle).
- ``/plugrl/env<i>/applied_action`` (Float64MultiArray, dim label ``action``): deploy mode only, the
  action the step applied before shaping (a blend of chunks' rows under ensemble or crossfade).
- ``/plugrl/env<i>/command/<sink>`` (Float64MultiArray, dim label = sink): values published after
  shaping (absent when the sink published nothing).
- ``/plugrl/env<i>/intervention`` (Float64MultiArray ``person,replaced``): with a person in the loop, at
  every step: a person commanded it; the policy's action did not run (the person's command or an idle ran).
- ``/plugrl/env<i>/person_command`` (Float64MultiArray, dim label ``action``): the person's command, in
  action units before shaping, at every step a person commanded.
- ``/plugrl/env<i>/step_result`` (Float64MultiArray ``reward,terminated,truncated,success``).
- ``/plugrl/env<i>/episode`` (Float64MultiArray ``return,length,success``): at each episode end.
- ``/plugrl/env<i>/answer`` (DiagnosticStatus): deploy mode only, what became of a policy server's
  answer: message = ``applied``, ``stale``, ``dropped``, ``unknown``, ``rejected`` or ``abandoned``;
  values = request, round_trip_s, first_row (the row that ran first), server_timing, detail (JSON).
- ``/plugrl/link/event`` (diagnostic_msgs/DiagnosticStatus): message = the event (connect,
  metadata, close, traceback, ...), values = epoch, code, reason, dropped_envs, env (deploy
  mode: whose connection), ... (JSON).
- ``/plugrl/link/latency`` (std_msgs/Float64): one request's round trip, seconds.
- ``/plugrl/recorder`` (DiagnosticStatus): the recorder's own counts (accepted, dropped).

Standard types only, so ``ros2 bag play`` can republish every channel. A
multi-field numeric record is a Float64MultiArray whose single dimension's
label lists the fields in order (plot ``.data[0]`` for the first). Every
message's log time is the time the event happened (the caller's clock), and
its MCAP ``sequence`` is the number of the recorder call it came from: the
messages of one call (an observation's images and states) share it, and a
gap means calls were dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any

import numpy as np

from plugrl_ros.record import schemas

PREFIX = "/plugrl"
CONFIG_TOPIC = f"{PREFIX}/config"
LINK_EVENT_TOPIC = f"{PREFIX}/link/event"
LATENCY_TOPIC = f"{PREFIX}/link/latency"
RECORDER_TOPIC = f"{PREFIX}/recorder"

STEP_FIELDS = ("chunk_step", "idle")
INTERVENTION = "intervention"
INTERVENTION_FIELDS = ("person", "replaced")
PERSON_COMMAND = "person_command"
APPLIED = "applied_action"
ANSWER = "answer"
ANSWER_OUTCOMES = ("applied", "stale", "dropped", "unknown", "rejected", "abandoned")
RESULT_FIELDS = ("reward", "terminated", "truncated", "success")
EPISODE_FIELDS = ("return", "length", "success")

SENT_IN = ("infer", "feedback")

# DiagnosticStatus levels
OK, WARN, ERROR = 0, 1, 2

_ENV_TOPIC = re.compile(r"^/plugrl/env(\d+)/(.+)$")


class Kind(Enum):
    """What a queued recorder call records."""

    CONFIG = "config"
    OBSERVATION = "observation"
    CHUNK = "chunk"
    STEP = "step"
    ANSWER = "answer"
    STEP_RESULT = "step_result"
    EPISODE = "episode"
    LINK = "link"
    LATENCY = "latency"
    RECORDER = "recorder"


# A step with a person in the loop: (a person commanded it; the policy's action did not run, the person's
# command or an idle did; the person's command in action units before shaping, or None)
Intervention = tuple[bool, bool, "np.ndarray | None"]

Message = tuple[str, str, dict]  # topic, schema name, body
ImageEncoder = Callable[[np.ndarray], tuple[str, bytes]] | None  # image -> (format, data); None: raw


def env_topic(env: int, rest: str) -> str:
    return f"{PREFIX}/env{env}/{rest}"


def split_env_topic(topic: str) -> tuple[int, str] | None:
    """``/plugrl/env3/step`` -> ``(3, "step")``; None for a topic that is not per env."""
    match = _ENV_TOPIC.match(topic)
    return (int(match.group(1)), match.group(2)) if match else None


def stamp(t_ns: int) -> dict:
    return {"sec": t_ns // 1_000_000_000, "nanosec": t_ns % 1_000_000_000}


def float_array(values: Any, labels: Sequence[str]) -> dict:
    """A Float64MultiArray of ``values`` whose dimensions carry ``labels`` (one per axis)."""
    array = np.asarray(values, dtype=np.float64)
    shape = array.shape if array.ndim else (1,)
    assert len(labels) == len(shape), (labels, shape)
    strides = [int(np.prod(shape[i:])) for i in range(len(shape))]
    dims = [
        {"label": label, "size": int(size), "stride": stride} for label, size, stride in zip(labels, shape, strides)
    ]
    return {"layout": {"dim": dims, "data_offset": 0}, "data": array.ravel().tolist()}


def fields(values: Sequence[float], names: Sequence[str]) -> dict:
    return float_array(values, [",".join(names)])


def status(level: int, name: str, message: str, values: Mapping[str, Any]) -> dict:
    """A DiagnosticStatus; non-string values are written as JSON so they read back typed."""
    pairs = [{"key": k, "value": v if isinstance(v, str) else json.dumps(v)} for k, v in values.items()]
    return {"level": level, "name": name, "message": message, "hardware_id": "", "values": pairs}


def image_message(image: np.ndarray, t_ns: int, name: str, encode: ImageEncoder) -> tuple[str, dict]:
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] in (1, 3, 4), (image.dtype, image.shape)
    header = {"stamp": stamp(t_ns), "frame_id": name}
    if encode is not None:
        fmt, data = encode(image)
        return schemas.COMPRESSED_IMAGE, {"header": header, "format": fmt, "data": data}
    h, w, c = image.shape
    encoding = {1: "mono8", 3: "rgb8", 4: "rgba8"}[c]
    data = np.ascontiguousarray(image).tobytes()
    body = {
        "header": header,
        "height": h,
        "width": w,
        "encoding": encoding,
        "is_bigendian": 0,
        "step": w * c,
        "data": data,
    }
    return schemas.IMAGE, body


def messages(kind: Kind, env: int, t_ns: int, payload: Any, encode: ImageEncoder) -> list[Message]:
    """The channel messages one recorder call becomes (runs where the file is written)."""
    if kind is Kind.OBSERVATION:
        sent_in, row = payload
        out: list[Message] = []
        for name, image in row.images.items():
            schema, body = image_message(image, t_ns, name, encode)
            out.append((env_topic(env, f"{sent_in}/images/{name}"), schema, body))
        for name, state in row.states.items():
            out.append((env_topic(env, f"{sent_in}/states/{name}"), schemas.FLOAT64_ARRAY, float_array(state, [name])))
        if row.text:
            out.append((env_topic(env, f"{sent_in}/text"), schemas.STRING, {"data": row.text}))
        return out
    if kind is Kind.CHUNK:
        action = np.asarray(payload)
        labels = ["step", "action"] + [f"action{i}" for i in range(1, action.ndim - 1)]
        return [(env_topic(env, "action_chunk"), schemas.FLOAT64_ARRAY, float_array(action, labels))]
    if kind is Kind.STEP:
        chunk_step, commanded, applied, intervention = payload
        idle = chunk_step is None
        out = [(env_topic(env, "step"), schemas.FLOAT64_ARRAY, fields([-1 if idle else chunk_step, idle], STEP_FIELDS))]
        if intervention is not None:
            person, replaced, command = intervention
            flags = fields([person, replaced], INTERVENTION_FIELDS)
            out.append((env_topic(env, INTERVENTION), schemas.FLOAT64_ARRAY, flags))
            if command is not None:
                values = float_array(np.ravel(command), ["action"])
                out.append((env_topic(env, PERSON_COMMAND), schemas.FLOAT64_ARRAY, values))
        if applied is not None:
            out.append((env_topic(env, APPLIED), schemas.FLOAT64_ARRAY, float_array(np.ravel(applied), ["action"])))
        for sink, values in commanded.items():
            if values is not None:
                out.append(
                    (env_topic(env, f"command/{sink}"), schemas.FLOAT64_ARRAY, float_array(np.ravel(values), [sink]))
                )
        return out
    if kind is Kind.STEP_RESULT:
        return [(env_topic(env, "step_result"), schemas.FLOAT64_ARRAY, fields(payload, RESULT_FIELDS))]
    if kind is Kind.EPISODE:
        return [(env_topic(env, "episode"), schemas.FLOAT64_ARRAY, fields(payload, EPISODE_FIELDS))]
    if kind is Kind.ANSWER:
        outcome, values = payload
        level = OK if outcome == "applied" else WARN
        return [(env_topic(env, ANSWER), schemas.DIAGNOSTIC_STATUS, status(level, "plugrl/answer", outcome, values))]
    if kind is Kind.LINK:
        level, event, values = payload
        return [(LINK_EVENT_TOPIC, schemas.DIAGNOSTIC_STATUS, status(level, "plugrl/link", event, values))]
    if kind is Kind.LATENCY:
        return [(LATENCY_TOPIC, schemas.FLOAT64, {"data": float(payload)})]
    if kind is Kind.CONFIG:
        return [(CONFIG_TOPIC, schemas.STRING, {"data": payload})]
    if kind is Kind.RECORDER:
        level, message, values = payload
        return [(RECORDER_TOPIC, schemas.DIAGNOSTIC_STATUS, status(level, "plugrl/recorder", message, values))]
    raise AssertionError(f"unhandled kind {kind}")
