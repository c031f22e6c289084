"""The ``policy`` section of the params file (deploy mode), parsed once into frozen dataclasses.

Pure parsing, like :mod:`plugrl_ros.ros.config`: a wrong type, an impossible
value or an unknown key fails at startup with the key's full dotted name, the
value given and what is allowed. The robot side (observations, actions,
sinks, pause, dead-man) is configured as for training; this section says
where the policy server is, how the request map is named, what an answer
must look like, and how chunks are executed.

    policy:
      uri: ws://gpu-box:8000
      api_key_env: ""            # the variable holding the key, never the key
      ca_file: ""                # CA bundle for wss:// ("" = system CAs)
      observations:              # request key -> source
        observation:
          image: images.front    # "observation/image" with key_separator "/"
          state: states.joints
        prompt: text             # observations.text: a fixed prompt or a topic
      key_separator: "/"         # "" sends nested maps instead
      action_key: actions
      action_horizon: 0          # 0: as the server announces, or its first answer
      action_dim: 0
      execution:
        mode: switch             # sync | switch | ensemble | crossfade
        request_ahead_steps: auto
        ensemble_rate: 0.01
        crossfade_steps: 5
      latency:
        initial_s: 0.1           # assumed until the first answer is measured
        max_s: 5.0               # an answer later than this: reconnect
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from plugrl_ros.policy.execution import MODES, ExecutionSettings
from plugrl_ros.protocol.client import ClientSettings
from plugrl_ros.protocol.policy.request import RequestInput, RequestLayout
from plugrl_ros.protocol.policy.session import DEFAULT_ACTION_KEY, Expectation
from plugrl_ros.ros.params import ConfigError

SECTION = "policy"
KEYS = (
    "uri",
    "api_key_env",
    "ca_file",
    "reconnect_initial_s",
    "reconnect_max_s",
    "open_timeout_s",
    "max_frame_mb",
    "observations",
    "key_separator",
    "action_key",
    "action_horizon",
    "action_dim",
    "execution",
    "latency",
)
EXECUTION_KEYS = ("mode", "request_ahead_steps", "ensemble_rate", "crossfade_steps")
LATENCY_KEYS = ("initial_s", "max_s")
SEPARATORS = ("/", ".", "")
AUTO = "auto"


@dataclass(frozen=True)
class PolicyConfig:
    """Deploy mode's settings: the server link, the request layout, the answer's shape, the execution."""

    server: ClientSettings
    layout: RequestLayout
    action_key: str
    action_horizon: int  # 0: not configured
    action_dim: int  # 0: not configured
    execution: ExecutionSettings

    def expectation(self, min_width: int, prefix: str = SECTION) -> Expectation:
        """What answers must look like, given how many values per step the robot's sinks read.

        ConfigError if ``action_dim`` is configured narrower than that.
        """
        if self.action_dim and self.action_dim < min_width:
            raise ConfigError(
                f"{prefix}.action_dim",
                self.action_dim,
                f"the actions' sinks read {min_width} values per step: at least {min_width}, or 0 (any)",
            )
        return Expectation(self.action_key, self.action_horizon, self.action_dim, min_width)


def load_policy_config(section: Any, sources: Collection[str], prefix: str = SECTION) -> PolicyConfig:
    """Parse the ``policy`` section; ``sources`` are the observation sources it may name (``images.front``, ...)."""
    s = _Reader(section, prefix)
    s.known(KEYS)
    server = ClientSettings(
        uri=_uri(s),
        api_key_env=s.str("api_key_env", ""),
        ca_file=s.str("ca_file", ""),
        reconnect_initial_s=s.number("reconnect_initial_s", 0.5, positive=True),
        reconnect_max_s=s.number("reconnect_max_s", 10.0, positive=True),
        open_timeout_s=s.number("open_timeout_s", 10.0, positive=True),
        max_frame_bytes=_frame_cap(s),
    )
    if server.reconnect_max_s < server.reconnect_initial_s:
        raise ConfigError(s.key("reconnect_max_s"), server.reconnect_max_s, "must be >= reconnect_initial_s")
    separator = s.str("key_separator", "/")
    if separator not in SEPARATORS:
        raise ConfigError(s.key("key_separator"), separator, '"/" or "." (flat keys), or "" (nested maps)')
    layout = _layout(s.sub("observations"), separator, sources)
    action_key = s.str("action_key", DEFAULT_ACTION_KEY)
    if not action_key:
        raise ConfigError(s.key("action_key"), action_key, "the answer's key holding the actions, e.g. actions")
    horizon = s.integer("action_horizon", 0, minimum=0)
    width = s.integer("action_dim", 0, minimum=0)
    execution = _execution(s.sub("execution"), s.sub("latency"), horizon)
    return PolicyConfig(server, layout, action_key, horizon, width, execution)


def check_policy_environment(config: PolicyConfig, environ: Mapping[str, str], prefix: str = SECTION) -> None:
    """What the section names outside itself, checked at startup: the API key's variable, the CA file."""
    problem = config.server.access_problem(environ)
    if problem is not None:
        setting, value, why = problem
        raise ConfigError(f"{prefix}.{setting}", value, why)


def _uri(s: _Reader) -> str:
    uri = s.str("uri")
    if not uri.startswith(("ws://", "wss://")) or len(uri) <= len("wss://"):
        raise ConfigError(s.key("uri"), uri, "a ws:// or wss:// URI, e.g. ws://192.168.1.10:8000")
    return uri


def _frame_cap(s: _Reader) -> int | None:
    megabytes = s.number("max_frame_mb", 0.0, minimum=0.0)
    return int(megabytes * 2**20) if megabytes else None


def _layout(s: _Reader, separator: str, sources: Collection[str]) -> RequestLayout:
    inputs: list[RequestInput] = []

    def walk(reader: _Reader, path: tuple[str, ...]) -> None:
        for name, value in reader.items():
            key = reader.key(name)
            if not name:
                raise ConfigError(key, value, "a request key must not be empty")
            if isinstance(value, Mapping):
                walk(reader.sub(name), (*path, name))
            elif not isinstance(value, str) or value not in sources:
                known = ", ".join(sorted(sources)) or "none configured"
                raise ConfigError(key, value, f"the source to send under this key; one of: {known}")
            else:
                inputs.append(RequestInput((*path, name), value))

    walk(s, ())
    if not inputs:
        raise ConfigError(
            s.prefix, {}, "map at least one request key to a source, e.g. observation/state: states.joints"
        )
    if separator:
        flat: dict[str, tuple[str, ...]] = {}
        for item in inputs:
            joined = separator.join(item.path)
            if joined in flat:
                raise ConfigError(
                    f"{s.prefix}.{'.'.join(item.path)}",
                    item.source,
                    f"the request key {joined!r} is given twice (also by {'.'.join(flat[joined])})",
                )
            flat[joined] = item.path
    return RequestLayout(tuple(inputs), separator)


def _execution(s: _Reader, latency: _Reader, horizon: int) -> ExecutionSettings:
    s.known(EXECUTION_KEYS)
    latency.known(LATENCY_KEYS)
    mode = s.str("mode", "switch")
    if mode not in MODES:
        raise ConfigError(s.key("mode"), mode, f"allowed: {', '.join(MODES)}")
    ahead_raw = s.raw("request_ahead_steps", AUTO)
    if ahead_raw == AUTO:
        ahead = None
    elif type(ahead_raw) is int and ahead_raw >= 0:
        ahead = ahead_raw
    else:
        raise ConfigError(
            s.key("request_ahead_steps"), ahead_raw, f"{AUTO!r} (from the measured latency) or a number of steps >= 0"
        )
    if ahead is not None and horizon and ahead >= horizon:
        raise ConfigError(
            s.key("request_ahead_steps"), ahead, f"must be below policy.action_horizon ({horizon}): a chunk has no more"
        )
    initial = latency.number("initial_s", 0.1, minimum=0.0)
    maximum = latency.number("max_s", 5.0, positive=True)
    if initial > maximum:
        raise ConfigError(latency.key("initial_s"), initial, f"must be at most latency.max_s ({maximum:g})")
    return ExecutionSettings(
        mode=mode,
        request_ahead_steps=ahead,
        ensemble_rate=s.number("ensemble_rate", 0.01),
        crossfade_steps=s.integer("crossfade_steps", 5, minimum=1),
        initial_latency_s=initial,
        max_latency_s=maximum,
    )


class _Reader:
    """Typed reads of one map of the section, with errors that name the full dotted key."""

    def __init__(self, values: Any, prefix: str) -> None:
        if not isinstance(values, Mapping):
            raise ConfigError(prefix, values, "expected a map of keys")
        self._values = dict(values)
        self.prefix = prefix

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    def items(self) -> list[tuple[str, Any]]:
        return list(self._values.items())

    def known(self, names: Collection[str]) -> None:
        for name in self._values:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ConfigError(
                    self.key(name), self._values[name], f"unknown key; {hint}known keys: {', '.join(sorted(names))}"
                )

    def raw(self, name: str, default: Any) -> Any:
        return self._values.get(name, default)

    def sub(self, name: str) -> _Reader:
        return _Reader(self._values.get(name, {}), self.key(name))

    def str(self, name: str, default: str | None = None) -> str:
        value = self._values.get(name, default)
        if value is None:
            raise ConfigError(self.key(name), value, "this key is required")
        if not isinstance(value, str):
            raise ConfigError(self.key(name), value, "expected a string")
        return value

    def integer(self, name: str, default: int, minimum: int | None = None) -> int:
        value = self._values.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.key(name), value, "expected an integer")
        if minimum is not None and value < minimum:
            raise ConfigError(self.key(name), value, f"must be at least {minimum}")
        return value

    def number(self, name: str, default: float, minimum: float | None = None, positive: bool = False) -> float:
        value = self._values.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(self.key(name), value, "expected a finite number")
        if positive and value <= 0:
            raise ConfigError(self.key(name), value, "must be greater than 0")
        if minimum is not None and value < minimum:
            raise ConfigError(self.key(name), value, f"must be at least {minimum:g}")
        return float(value)
