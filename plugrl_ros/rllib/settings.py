"""The PlugRL EnvRunner's settings: where it listens and how it paces the robots, from ``env_config``.

RLlib hands every EnvRunner the ``AlgorithmConfig``; its ``env_config`` is
where an env's own settings live, so the runner's are under
``env_config["plugrl"]`` (:meth:`RunnerSettings.env_config` writes them). They
are checked when the runner starts, naming the key, the value and what is
allowed, together with the RLlib settings they depend on
(:func:`check_against`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plugrl_ros.protocol.server_auth import DEFAULT_API_KEY_ENV, ServerAccess

ENV_CONFIG_KEY = "plugrl"
PROTOCOL_FEEDBACK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RunnerSettings:
    """How one PlugRL EnvRunner serves its bridges."""

    # The address to listen on: 127.0.0.1 serves this machine only; 0.0.0.0 (or one interface's
    # address) lets robots on other machines connect.
    host: str = "127.0.0.1"
    # Runner i (RLlib's worker_index: 0 is the local runner, which serves only when
    # num_env_runners is 0; remote runners are 1..N) listens on port + i. 0 picks a free port.
    port: int = 8000
    horizon: int = 1  # H, steps per action chunk; the action space is the whole chunk
    # The longest one sample() call waits for robots before it returns what it has (maybe
    # nothing): RLlib drops a remote runner's sample that takes longer than sample_timeout_s.
    sample_wait_s: float = 10.0
    # False (on-policy): infers are answered only inside sample(), so the robots idle during
    # the learner's update and every step of a batch comes from the weights it is trained on.
    # True: robots are answered through updates too, with whatever weights the runner holds.
    serve_during_updates: bool = False
    # With serve_during_updates: the Python interpreter's thread switch interval in the runner's
    # process (sys.setswitchinterval), the longest a thread waits for the interpreter lock while
    # another runs Python. The websocket thread takes it again after every wait for a frame or a
    # send; beside the driver's Python at the default 5 ms, a step's waits can fill a 20 ms control
    # tick. Lowered only, never raised; None leaves the interpreter's setting.
    switch_interval_s: float | None = 0.0005
    # Close a connection whose feedback is this late after an action, as a PlugRL server does.
    feedback_timeout_s: float = PROTOCOL_FEEDBACK_TIMEOUT_S
    # RLlib's evaluation runners (evaluation_interval set) are runners too, numbered like the
    # training ones: evaluation runner i listens on evaluation_port + i, for bridges of robots that
    # evaluate. None (the default): a runner refuses to start as an evaluation runner. 0: free ports.
    evaluation_port: int | None = None
    # Who may connect (docs/security.md). The environment variable holding the API key every bridge
    # must send, read where the runner runs (never the key itself: env_config travels with the
    # algorithm's config and checkpoints); when the default variable is unset, no key is asked.
    api_key_env: str = DEFAULT_API_KEY_ENV
    # PEM certificate chain (and its private key, if not in the same file) to serve wss://; the
    # paths must exist on every machine a runner may be placed on.
    tls_cert: str = ""
    tls_key: str = ""
    # A fleet on a Ray cluster (plugrl_ros.rllib.sites): the name of the Ray node label that says which
    # robots' site a node is (``ray start --labels plugrl-site=A``). Set, every runner listens on ``port``
    # itself (evaluation runners on ``evaluation_port``), whatever its worker index, on the node Ray placed
    # it on, and refuses to start on a node without the label: a bridge's trainer.uri is
    # ws://<site node>:<port>, and stays so when Ray restarts the runner there. None: port + worker index.
    site_label: str | None = None

    def __post_init__(self) -> None:
        _check(isinstance(self.host, str) and bool(self.host), "host", self.host, "an address to listen on")
        _check(_is_int(self.port) and 0 <= self.port <= 65535, "port", self.port, "a port in 0..65535")
        _check(_is_int(self.horizon) and self.horizon >= 1, "horizon", self.horizon, "an integer of at least 1")
        _check(_is_number(self.sample_wait_s) and self.sample_wait_s > 0, "sample_wait_s", self.sample_wait_s, "> 0")
        _check(isinstance(self.serve_during_updates, bool), "serve_during_updates", self.serve_during_updates, "a bool")
        _check(
            self.switch_interval_s is None or (_is_number(self.switch_interval_s) and 0 < self.switch_interval_s <= 1),
            "switch_interval_s",
            self.switch_interval_s,
            "None or seconds in (0, 1]",
        )
        _check(
            self.evaluation_port is None or (_is_int(self.evaluation_port) and 0 <= self.evaluation_port <= 65535),
            "evaluation_port",
            self.evaluation_port,
            "None or a port in 0..65535",
        )
        for name in ("api_key_env", "tls_cert", "tls_key"):
            _check(isinstance(getattr(self, name), str), name, getattr(self, name), "a string")
        _check(not self.tls_key or bool(self.tls_cert), "tls_key", self.tls_key, "tls_cert to be set as well")
        _check(
            self.site_label is None or (isinstance(self.site_label, str) and bool(self.site_label)),
            "site_label",
            self.site_label,
            "None or the name of a Ray node label (ray start --labels NAME=SITE)",
        )
        _check(
            _is_number(self.feedback_timeout_s) and self.feedback_timeout_s > 0,
            "feedback_timeout_s",
            self.feedback_timeout_s,
            "> 0 seconds",
        )

    @property
    def access(self) -> ServerAccess:
        return ServerAccess(api_key_env=self.api_key_env, tls_cert=self.tls_cert, tls_key=self.tls_key)

    def env_config(self, **more: Any) -> dict[str, Any]:
        """An ``env_config`` carrying these settings (plus ``more`` keys of your own)."""
        return {**more, ENV_CONFIG_KEY: dataclasses.asdict(self)}

    @classmethod
    def from_env_config(cls, env_config: Mapping[str, Any] | None) -> RunnerSettings:
        """The settings under ``env_config["plugrl"]`` (the defaults if absent); ValueError naming a bad key."""
        given = (env_config or {}).get(ENV_CONFIG_KEY, {})
        if not isinstance(given, Mapping):
            raise ValueError(f'env_config["{ENV_CONFIG_KEY}"]: got {given!r}; expected a map of runner settings')
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(
                f'env_config["{ENV_CONFIG_KEY}"]["{unknown[0]}"]: unknown setting; known: {", ".join(sorted(known))}'
            )
        return cls(**dict(given))

    def port_of(self, worker_index: int, evaluation: bool = False) -> int:
        """The port runner ``worker_index`` (of the evaluation runners if ``evaluation``) listens on (0: a free port).

        With ``site_label`` the index plays no part: one runner per site node, on
        the site's fixed port (see :mod:`plugrl_ros.rllib.sites`).

        ValueError for an evaluation runner without ``evaluation_port``: it would
        take a training runner's port (the same index) and fail to listen, or
        serve the training robots.
        """
        if evaluation:
            if self.evaluation_port is None:
                raise ValueError(
                    f'PlugRL evaluation runner {worker_index}: env_config["{ENV_CONFIG_KEY}"]["evaluation_port"] '
                    "is not set. RLlib's evaluation runners (evaluation_interval) are numbered like the training "
                    "runners and would take their ports: set evaluation_port (evaluation runner i listens on "
                    "evaluation_port + i; point the evaluating robots' bridges there), or leave evaluation_interval "
                    "unset"
                )
            base = self.evaluation_port
        else:
            base = self.port
        if base == 0 or self.site_label is not None:
            return base
        return base + worker_index


def check_against(settings: RunnerSettings, sample_timeout_s: float | None) -> None:
    """The runner's wait must end before RLlib gives up on the sample (ValueError naming both keys)."""
    if sample_timeout_s is not None and settings.sample_wait_s >= sample_timeout_s:
        raise ValueError(
            f'env_config["{ENV_CONFIG_KEY}"]["sample_wait_s"] ({settings.sample_wait_s:g} s) must be below '
            f"env_runners(sample_timeout_s=...) ({sample_timeout_s:g} s): RLlib drops a remote sample that "
            "takes longer, and the robots' steps in it with it"
        )


def _check(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ValueError(f'env_config["{ENV_CONFIG_KEY}"]["{name}"]: got {value!r}; expected {allowed}')


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
