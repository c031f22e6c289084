"""Who may talk to a server the package ships: the API key checked at the handshake, and TLS.

Every server here (the RLlib runner, the demo and test trainers, the test
policy server) listens through :func:`plugrl_ros.tools.serving.serve_trainer`,
which takes a :class:`ServerAccess`. A server with a key refuses a handshake
that does not carry ``Authorization: Api-Key <key>`` with HTTP 401, before
any metadata, so a host that merely reaches the port can neither feed
transitions to a learner nor learn what it serves. The key is read from an
environment variable (named by a setting, ``PLUGRL_API_KEY`` by default) and
never appears in a setting, a command line or a log; refusals are logged
with the peer's address, at most once per peer per ``quiet_s``, so a
scanner cannot flood the log.
"""

from __future__ import annotations

import hmac
import http
import ipaddress
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import MultipleValuesError
from websockets.http11 import Request, Response

from plugrl_ros.protocol.client import padded_key

DEFAULT_API_KEY_ENV = "PLUGRL_API_KEY"
REFUSAL_LOG_INTERVAL_S = 60.0
_MAX_PEERS_REMEMBERED = 1024  # a scan from many addresses must not grow the refusal log's memory without bound


class AccessError(ValueError):
    """A server's access setting cannot be used (a named key variable unset, a certificate that does not load)."""

    def __init__(self, setting: str, detail: str) -> None:
        super().__init__(f"{setting}: {detail}")
        self.setting = setting
        self.detail = detail


@dataclass(frozen=True)
class ServerAccess:
    """How a server decides who may connect. Only the key's variable is held here, never the key.

    ``api_key_env``: the environment variable holding the key. When it is set
    (non-empty), every handshake must carry that key. The default variable may
    be left unset (the server is then open, and says so at startup); any other
    name must be set, or the server refuses to start. ``""`` means no key at all.
    ``tls_cert`` (with ``tls_key`` if the key is not in the same PEM file): serve
    ``wss://``.
    """

    api_key_env: str = DEFAULT_API_KEY_ENV
    tls_cert: str = ""
    tls_key: str = ""

    @property
    def scheme(self) -> str:
        return "wss" if self.tls_cert else "ws"

    def api_key(self, environ: Mapping[str, str]) -> str | None:
        """The key every client must present; None for an open server (AccessError if a named variable is unset)."""
        if not self.api_key_env:
            return None
        key = environ.get(self.api_key_env, "")
        if key:
            padded = padded_key(self.api_key_env, key)
            if padded:
                raise AccessError("api_key_env", padded)
            return key
        if self.api_key_env == DEFAULT_API_KEY_ENV:
            return None
        raise AccessError(
            "api_key_env",
            f"got {self.api_key_env!r}; the environment variable {self.api_key_env} is not set or "
            f"empty. Set it to the key the bridges send, or leave api_key_env at {DEFAULT_API_KEY_ENV} "
            'unset (or "") for a server without a key',
        )

    def tls_context(self) -> ssl.SSLContext | None:
        """The server side of TLS for ``tls_cert``/``tls_key``; None for plain ``ws://`` (AccessError if unusable)."""
        if not self.tls_cert:
            if self.tls_key:
                raise AccessError("tls_key", f"got {self.tls_key!r} without tls_cert; give the certificate too")
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.tls_cert, self.tls_key or None)
        except (OSError, ssl.SSLError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            key = f" with tls_key {self.tls_key!r}" if self.tls_key else ""
            raise AccessError(
                "tls_cert", f"cannot load {self.tls_cert!r}{key} as a PEM certificate chain and private key: {reason}"
            ) from exc
        return context

    def describe(self, environ: Mapping[str, str], host: str) -> tuple[int, str]:
        """What a server says about its access at startup: (logging level, text). Names the variable, never the key."""
        transport = "TLS (wss://)" if self.tls_cert else "no TLS (ws://)"
        if self.api_key(environ) is not None:
            return logging.INFO, f"clients must present the API key from ${self.api_key_env}; {transport}"
        if _is_loopback_host(host):
            return logging.INFO, f"no API key required (this machine only); {transport}"
        hint = f"set ${DEFAULT_API_KEY_ENV}" if self.api_key_env else "name a key variable (api_key_env)"
        return (
            logging.WARNING,
            f"listening on {host} WITHOUT an API key: any host that reaches this port can connect, "
            f"send transitions and read actions; {hint} (see docs/security.md); {transport}",
        )


class RefusalLog:
    """Refused handshakes, logged with the peer's address at most once per peer per ``quiet_s``, with a count."""

    def __init__(
        self,
        logger: logging.Logger,
        quiet_s: float = REFUSAL_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._quiet_s = quiet_s
        self._clock = clock
        # peer host -> (when it was last logged, refusals since then not logged)
        self._peers: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def refused(self, peer: str, why: str) -> bool:
        """Note one refusal from ``peer``; True if it was logged (not held back by the rate limit)."""
        now = self._clock()
        last = self._peers.get(peer)
        if last is not None and now - last[0] < self._quiet_s:
            self._peers[peer] = (last[0], last[1] + 1)
            return False
        held = f" ({last[1]} more refused since the last report)" if last is not None and last[1] else ""
        self._logger.warning(f"refused a connection from {peer}: {why} (HTTP 401){held}")
        self._peers[peer] = (now, 0)
        self._peers.move_to_end(peer)
        while len(self._peers) > _MAX_PEERS_REMEMBERED:
            self._peers.popitem(last=False)
        return True


class ApiKeyGate:
    """websockets' ``process_request`` hook that answers 401 unless the handshake carries the key."""

    def __init__(self, key: str, refusals: RefusalLog) -> None:
        self._expected = f"Api-Key {key}".encode()
        self._refusals = refusals

    def __call__(self, connection: ServerConnection, request: Request) -> Response | None:
        try:
            given = request.headers.get("Authorization")
        except MultipleValuesError:  # two keys are no key: 401 like any other refusal, not a 500 with a traceback
            given, why = None, "more than one Authorization header"
        else:
            why = "no API key" if given is None else "wrong API key"
        # compare bytes in constant time: how long a comparison takes must not tell how much of a guess was right
        if given is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self._expected):
            return None
        self._refusals.refused(_peer(connection), why)
        response = connection.respond(
            http.HTTPStatus.UNAUTHORIZED, "a valid 'Authorization: Api-Key <key>' header is required\n"
        )
        response.headers["WWW-Authenticate"] = "Api-Key"
        return response


class HandshakeNoise(logging.Filter):
    """Drops websockets' per-attempt INFO lines about a handshake answered without a connection.

    websockets logs "HTTP response sent (401 Unauthorized)" (or "connection
    rejected") and then "connection closed" for every refused attempt: two
    lines each, unthrottled, where :class:`RefusalLog` says the same once a
    minute per address. Lines about connections that opened, and every warning
    or error, pass.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        try:
            response = record.websocket.response  # a weak proxy of the connection; gone or not there
        except (AttributeError, ReferenceError):
            return True
        return response is None or response.status_code == http.HTTPStatus.SWITCHING_PROTOCOLS


def without_handshake_noise(logger: logging.Logger) -> logging.Logger:
    """``logger`` (websockets' server side) with refused handshakes' lines dropped (:class:`HandshakeNoise`)."""
    if not any(isinstance(f, HandshakeNoise) for f in logger.filters):
        logger.addFilter(HandshakeNoise())
    return logger


def _peer(connection: ServerConnection) -> str:
    address = connection.remote_address
    if isinstance(address, tuple) and address:
        return str(address[0])  # the host only: a client's port changes with every attempt
    return str(address)


def _is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
