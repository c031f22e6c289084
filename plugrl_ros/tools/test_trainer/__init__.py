"""A protocol-checking PlugRL trainer for tests: serves one client and reports, clause by clause, what it broke.

The protocol's rules come from the server-side core
(:class:`plugrl_ros.protocol.trainer_connection.TrainerConnection`); this
package adds what a conformance checker checks beyond a server, by clause
group: ``exchange`` files the core's findings under the message and exchange
clauses, ``probe_checks`` the probe environment's clauses, ``wire_checks``
the transport and close clauses; ``server`` runs the script of endings,
``report`` keeps the score, ``cli`` is ``plugrl-test-trainer``.
"""

from plugrl_ros.tools.test_trainer.clauses import (
    ALTERNATION,
    ARRAYS,
    BINARY_FRAMES,
    CHUNK_LENGTH,
    CLAUSES,
    ENV_SETS,
    ENVELOPE,
    INFO_EPISODE,
    LARGE_METADATA,
    NO_COMPRESSION,
    NO_EMPTY_CONNECTIONS,
    OBSERVATION,
    RECONNECTS,
    RESET_OBSERVATION,
    REUSE,
    REWARD_SUM,
    STOP_EXITS,
    TERMINAL_OBSERVATION,
    TEXT_FATAL,
    TIME_MAJOR,
    WAITS_FOR_METADATA,
)
from plugrl_ros.tools.test_trainer.cli import main
from plugrl_ros.tools.test_trainer.report import ClauseResult, Exchanged, Report
from plugrl_ros.tools.test_trainer.server import TestTrainer, run_trainer
from plugrl_ros.tools.test_trainer.settings import (
    ENDINGS,
    FINAL_ENDINGS,
    RECONNECT_ENDINGS,
    TrainerSettings,
    action_chunk,
    probe_episode_length,
)

__all__ = [
    "ALTERNATION",
    "ARRAYS",
    "BINARY_FRAMES",
    "CHUNK_LENGTH",
    "CLAUSES",
    "ENDINGS",
    "ENVELOPE",
    "ENV_SETS",
    "FINAL_ENDINGS",
    "INFO_EPISODE",
    "LARGE_METADATA",
    "NO_COMPRESSION",
    "NO_EMPTY_CONNECTIONS",
    "OBSERVATION",
    "RECONNECTS",
    "RECONNECT_ENDINGS",
    "RESET_OBSERVATION",
    "REUSE",
    "REWARD_SUM",
    "STOP_EXITS",
    "TERMINAL_OBSERVATION",
    "TEXT_FATAL",
    "TIME_MAJOR",
    "WAITS_FOR_METADATA",
    "ClauseResult",
    "Exchanged",
    "Report",
    "TestTrainer",
    "TrainerSettings",
    "action_chunk",
    "main",
    "probe_episode_length",
    "run_trainer",
]
