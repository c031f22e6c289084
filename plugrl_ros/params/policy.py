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
        max_s: 5.0               # an answer later than this: the link is dead, reconnect
        first_answer_s: 300.0    # the same for a connection's first answer (a model may compile)
      tcp_timeout_s: 20.0        # TCP keepalive / TCP_USER_TIMEOUT (0 = the OS defaults)

Every key's type, default and range is declared in the bridge's table
(:mod:`plugrl_ros.params.declarations`; :data:`POLICY_SPECS` is its policy part)
and read through :class:`plugrl_ros.params.section.Section`, so the keys read are
recorded with the rest of the configuration and declared on the node.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from plugrl_ros.params.declarations import POLICY_KEY_SEPARATORS, SPECS, Spec
from plugrl_ros.params.section import ConfigError, Section
from plugrl_ros.policy.execution import ONE_STEP_CHUNKS, ExecutionSettings
from plugrl_ros.protocol.client import ClientSettings
from plugrl_ros.protocol.policy.request import RequestInput, RequestLayout
from plugrl_ros.protocol.policy.session import Expectation

SECTION = "policy"
SEPARATORS = POLICY_KEY_SEPARATORS

POLICY_SPECS: tuple[Spec, ...] = tuple(spec for spec in SPECS if spec.key.startswith(f"{SECTION}."))


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
    if not isinstance(values, Mapping):
        raise ConfigError(prefix, values, "expected a map of keys")
    s = Section(values, prefix, used)
    server = ClientSettings(
        uri=_uri(s),
        api_key_env=s.str("api_key_env"),
        ca_file=s.str("ca_file"),
        reconnect_initial_s=s.float("reconnect_initial_s"),
        reconnect_max_s=s.float("reconnect_max_s"),
        open_timeout_s=s.float("open_timeout_s"),
        tcp_timeout_s=s.float("tcp_timeout_s"),
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


def _uri(s: Section) -> str:
    uri = s.str("uri")
    if not uri.startswith(("ws://", "wss://")) or len(uri) <= len("wss://"):
        raise ConfigError(s.key("uri"), uri, "a ws:// or wss:// URI, e.g. ws://192.168.1.10:8000")
    return uri


def _layout(s: Section, separator: str, sources: Collection[str]) -> RequestLayout:
    inputs: list[RequestInput] = []

    def walk(reader: Section, path: tuple[str, ...]) -> None:
        for name in reader.names():
            if isinstance(reader.values().get(name), Mapping):
                walk(reader.section(name), (*path, name))
                continue
            if len(path) >= 3:
                raise ConfigError(reader.key(name), reader.values().get(name), "request keys nest at most three levels")
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


def _execution(s: Section, latency: Section, horizon: int) -> ExecutionSettings:
    mode = s.str("mode")
    if horizon == 1 and mode != "sync":
        raise ConfigError(s.key("mode"), mode, f"policy.action_horizon is 1: {ONE_STEP_CHUNKS}")
    ahead = s.int("request_ahead_steps")
    if ahead and horizon and ahead >= horizon:
        raise ConfigError(
            s.key("request_ahead_steps"), ahead, f"must be below policy.action_horizon ({horizon}): a chunk has no more"
        )
    initial = latency.float("initial_s")
    maximum = latency.float("max_s")
    first = latency.float("first_answer_s")
    if initial > maximum:
        raise ConfigError(latency.key("initial_s"), initial, f"must be at most latency.max_s ({maximum:g})")
    settings = ExecutionSettings(
        mode=mode,
        request_ahead_steps=ahead or None,
        ensemble_rate=s.float("ensemble_rate"),
        crossfade_steps=s.int("crossfade_steps"),
        initial_latency_s=initial,
        max_latency_s=maximum,
        first_answer_s=first,
    )
    s.finish()
    latency.finish()
    return settings
