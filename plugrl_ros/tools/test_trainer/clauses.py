"""The clauses the test trainer reports on, by group: transport, handshake, message, exchange, probe, close."""

from __future__ import annotations

NO_COMPRESSION = "transport.no-compression"
BINARY_FRAMES = "transport.binary-frames"
WAITS_FOR_METADATA = "handshake.waits-for-metadata"
LARGE_METADATA = "handshake.large-metadata"
ENVELOPE = "message.envelope"
ARRAYS = "message.arrays"
OBSERVATION = "message.observation"
ALTERNATION = "exchange.alternation"
ENV_SETS = "exchange.env-sets"
REUSE = "exchange.reuse"
CHUNK_LENGTH = "probe.chunk-length"
REWARD_SUM = "probe.reward-sum"
TERMINAL_OBSERVATION = "probe.terminal-observation"
TIME_MAJOR = "probe.time-major-order"
RESET_OBSERVATION = "probe.reset-observation"
INFO_EPISODE = "probe.info-episode"
RECONNECTS = "close.reconnects"
STOP_EXITS = "close.stop-exits"
TEXT_FATAL = "close.text-fatal"
# A client opens a connection to use it: one closed before its first message, while the run goes on, is a
# client that connected and left (PlugRL's conformance checker fails it; a trainer in production sees a
# stranger). Judged on every connection the trainer did not end or stop.
NO_EMPTY_CONNECTIONS = "close.no-empty-connections"

CLAUSES: tuple[str, ...] = (
    NO_COMPRESSION,
    BINARY_FRAMES,
    WAITS_FOR_METADATA,
    LARGE_METADATA,
    ENVELOPE,
    ARRAYS,
    OBSERVATION,
    ALTERNATION,
    ENV_SETS,
    REUSE,
    CHUNK_LENGTH,
    REWARD_SUM,
    TERMINAL_OBSERVATION,
    TIME_MAJOR,
    RESET_OBSERVATION,
    INFO_EPISODE,
    RECONNECTS,
    STOP_EXITS,
    TEXT_FATAL,
    NO_EMPTY_CONNECTIONS,
)
