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
        request_ahead_steps: 0   # 0: from the measured latency
        ensemble_rate: 0.01
        crossfade_steps: 5
      latency:
        initial_s: 0.1           # assumed until the first answer is measured
        max_s: 5.0               # an answer later than this: reconnect

Every key's type, default and range is declared in :data:`POLICY_SPECS`, in
the form of :mod:`plugrl_ros.ros.declarations`. They are kept apart from the
bridge's table until the node runs deploy mode: the README's table and the
shipped config show only what the bridge runs. The keys read are recorded in
:attr:`PolicyReader.used`, ready to be declared on the node.
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
from plugrl_ros.ros.declarations import REQUIRED, Spec, find_spec
from plugrl_ros.ros.params import ConfigError

SECTION = "policy"
SEPARATORS = ("/", ".", "")
_SOURCE = "the source sent under this key: images.<name>, states.<name> or text"

POLICY_SPECS: tuple[Spec, ...] = (
    Spec("policy.uri", "str", REQUIRED, "policy server address, ws:// or wss://"),
    Spec("policy.api_key_env", "str", "", "name of the environment variable holding the API key (never the key)"),
    Spec("policy.ca_file", "str", "", 'CA bundle for a wss:// server ("" = system CAs)'),
    Spec("policy.reconnect_initial_s", "float", 0.5, "first reconnect delay (doubling, jittered)", positive=True),
    Spec("policy.reconnect_max_s", "float", 10.0, "longest reconnect delay", positive=True),
    Spec(
        "policy.open_timeout_s", "float", 10.0, "one connection attempt's timeout (and the metadata's)", positive=True
    ),
    Spec("policy.max_frame_mb", "float", 0.0, "refuse larger answers (0 = any size)", minimum=0.0),
    Spec("policy.observations.<name>", "str", REQUIRED, _SOURCE),
    Spec("policy.observations.<name>.<part>", "str", REQUIRED, _SOURCE),
    Spec("policy.observations.<name>.<part>.<leaf>", "str", REQUIRED, _SOURCE),
    Spec(
        "policy.key_separator",
        "str",
        "/",
        'joins nested observation names into one request key ("" = send nested maps)',
        choices=SEPARATORS,
    ),
    Spec("policy.action_key", "str", DEFAULT_ACTION_KEY, "the answer's key holding the actions [H, action_dim]"),
    Spec("policy.action_horizon", "int", 0, "expected H (0 = as announced, or the first answer's)", minimum=0),
    Spec("policy.action_dim", "int", 0, "expected action width (0 = as announced, or the first answer's)", minimum=0),
    Spec("policy.execution.mode", "str", "switch", "how a new chunk takes over", choices=MODES),
    Spec(
        "policy.execution.request_ahead_steps",
        "int",
        0,
        "request the next chunk with this many steps left (0 = from the measured latency)",
        minimum=0,
    ),
    Spec("policy.execution.ensemble_rate", "float", 0.01, "ensemble weights exp(-rate * i), i = 0 the oldest"),
    Spec("policy.execution.crossfade_steps", "int", 5, "ticks a crossfade takes", minimum=1),
    Spec("policy.latency.initial_s", "float", 0.1, "request latency assumed until one is measured", minimum=0.0),
    Spec("policy.latency.max_s", "float", 5.0, "a request unanswered this long: reconnect", positive=True),
)


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


def load_policy_config(
    values: Any, sources: Collection[str], used: dict[str, Any] | None = None, prefix: str = SECTION
) -> PolicyConfig:
    """Parse the ``policy`` section's nested values; ``sources`` are what it may name (``images.front``, ...).

    ``used`` (if given) receives every dotted key read and its value, defaults included.
    """
    s = PolicyReader(values, prefix, {} if used is None else used)
    server = ClientSettings(
        uri=_uri(s),
        api_key_env=s.str("api_key_env"),
        ca_file=s.str("ca_file"),
        reconnect_initial_s=s.float("reconnect_initial_s"),
        reconnect_max_s=s.float("reconnect_max_s"),
        open_timeout_s=s.float("open_timeout_s"),
        max_frame_bytes=int(s.float("max_frame_mb") * 2**20) or None,
    )
    if server.reconnect_max_s < server.reconnect_initial_s:
        raise ConfigError(s.key("reconnect_max_s"), server.reconnect_max_s, "must be >= reconnect_initial_s")
    layout = _layout(s.section("observations"), s.str("key_separator"), sources)
    action_key = s.str("action_key")
    if not action_key:
        raise ConfigError(s.key("action_key"), action_key, "the answer's key holding the actions, e.g. actions")
    horizon = s.int("action_horizon")
    width = s.int("action_dim")
    execution = _execution(s.section("execution"), s.section("latency"), horizon)
    s.finish()
    return PolicyConfig(server, layout, action_key, horizon, width, execution)


def check_policy_environment(config: PolicyConfig, environ: Mapping[str, str], prefix: str = SECTION) -> None:
    """What the section names outside itself, checked at startup: the API key's variable, the CA file."""
    problem = config.server.access_problem(environ)
    if problem is not None:
        setting, value, why = problem
        raise ConfigError(f"{prefix}.{setting}", value, why)


def _uri(s: PolicyReader) -> str:
    uri = s.str("uri")
    if not uri.startswith(("ws://", "wss://")) or len(uri) <= len("wss://"):
        raise ConfigError(s.key("uri"), uri, "a ws:// or wss:// URI, e.g. ws://192.168.1.10:8000")
    return uri


def _layout(s: PolicyReader, separator: str, sources: Collection[str]) -> RequestLayout:
    inputs: list[RequestInput] = []

    def walk(reader: PolicyReader, path: tuple[str, ...]) -> None:
        for name in reader.names():
            if isinstance(reader.raw(name), Mapping):
                walk(reader.section(name), (*path, name))
                continue
            if len(path) >= 3:
                raise ConfigError(reader.key(name), reader.raw(name), "request keys nest at most three levels")
            value = reader.str(name)
            if value not in sources:
                known = ", ".join(sorted(sources)) or "none configured"
                raise ConfigError(reader.key(name), value, f"the source to send under this key; one of: {known}")
            inputs.append(RequestInput((*path, name), value))
        reader.finish()

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


def _execution(s: PolicyReader, latency: PolicyReader, horizon: int) -> ExecutionSettings:
    mode = s.str("mode")
    ahead = s.int("request_ahead_steps")
    if ahead and horizon and ahead >= horizon:
        raise ConfigError(
            s.key("request_ahead_steps"), ahead, f"must be below policy.action_horizon ({horizon}): a chunk has no more"
        )
    initial = latency.float("initial_s")
    maximum = latency.float("max_s")
    if initial > maximum:
        raise ConfigError(latency.key("initial_s"), initial, f"must be at most latency.max_s ({maximum:g})")
    settings = ExecutionSettings(
        mode=mode,
        request_ahead_steps=ahead or None,
        ensemble_rate=s.float("ensemble_rate"),
        crossfade_steps=s.int("crossfade_steps"),
        initial_latency_s=initial,
        max_latency_s=maximum,
    )
    s.finish()
    latency.finish()
    return settings


class PolicyReader:
    """Typed reads of one map of the section, defaults and ranges from :data:`POLICY_SPECS`.

    The same contract as :class:`plugrl_ros.ros.params.Section` (errors name
    the full dotted key; :meth:`finish` refuses a key nobody read), over a
    table of its own.
    """

    def __init__(self, values: Any, prefix: str, used: dict[str, Any]) -> None:
        if not isinstance(values, Mapping):
            raise ConfigError(prefix, values, "expected a map of keys")
        self._values = dict(values)
        self._read: set[str] = set()
        self.prefix = prefix
        self.used = used

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}"

    def names(self) -> list[str]:
        return list(self._values)

    def raw(self, name: str) -> Any:
        return self._values.get(name)

    def section(self, name: str) -> PolicyReader:
        self._read.add(name)
        return PolicyReader(self._values.get(name, {}), self.key(name), self.used)

    def finish(self) -> None:
        """Refuse a key nobody read: a misspelt key must not be silently ignored."""
        unknown = sorted(set(self._values) - self._read)
        if unknown:
            known = sorted(self._read)
            close = difflib.get_close_matches(unknown[0], known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                self.key(unknown[0]), self._values[unknown[0]], f"unknown key; {hint}known keys: {', '.join(known)}"
            )

    def _get(self, name: str, kind: str) -> tuple[Any, Spec]:
        key = self.key(name)
        spec = find_spec(key, POLICY_SPECS)
        assert spec is not None and spec.kind == kind, f"{key} is read as {kind} but not declared so in POLICY_SPECS"
        self._read.add(name)
        value = self._values.get(name, spec.default)
        if value is REQUIRED:
            raise ConfigError(key, None, "this key is required")
        self.used[key] = value
        return value, spec

    def str(self, name: str) -> str:
        value, spec = self._get(name, "str")
        if not isinstance(value, str):
            raise ConfigError(self.key(name), value, "expected a string")
        if spec.choices and value not in spec.choices:
            raise ConfigError(self.key(name), value, "allowed: " + ", ".join(repr(c) for c in spec.choices))
        return value

    def int(self, name: str) -> int:
        value, spec = self._get(name, "int")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.key(name), value, "expected an integer")
        self._check_range(name, value, spec)
        return value

    def float(self, name: str) -> float:
        value, spec = self._get(name, "float")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(self.key(name), value, "expected a finite number")
        self._check_range(name, float(value), spec)
        return float(value)

    def _check_range(self, name: str, value: float, spec: Spec) -> None:
        if spec.positive and value <= 0:
            raise ConfigError(self.key(name), value, "must be greater than 0")
        if spec.minimum is not None and value < spec.minimum:
            raise ConfigError(self.key(name), value, f"must be at least {spec.minimum:g}")
        if spec.maximum is not None and value > spec.maximum:
            raise ConfigError(self.key(name), value, f"must be at most {spec.maximum:g}")
