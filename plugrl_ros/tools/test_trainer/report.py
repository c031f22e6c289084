"""The test trainer's report: each clause's passed and failed checks, the notes, and the text it prints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from plugrl_ros.tools.test_trainer.clauses import CLAUSES

_MAX_STORED_DETAILS = 20
_SHOWN_DETAILS = 5


@dataclass(frozen=True)
class ClauseResult:
    """One clause's checks: how many passed, how many failed, and what went wrong (first few)."""

    name: str
    passed: int
    failed: int
    failures: tuple[str, ...]

    @property
    def checks(self) -> int:
        return self.passed + self.failed

    @property
    def status(self) -> str:
        if self.failed:
            return "FAIL"
        return "PASS" if self.passed else "not exercised"


@dataclass(frozen=True)
class Exchanged:
    """One message as the test trainer received it, and for an infer the action chunk it answered with.

    Arrays are as decoded (``observation`` holds an infer's rows that were not
    reused, in order); a field the message made unusable is None.
    """

    connection: int
    kind: str  # "infer" or "feedback"
    env_indices: tuple[int, ...]
    step_ids: tuple[int, ...] | None
    reuse: tuple[bool, ...] | None
    observation: Any
    action: np.ndarray | None = None  # infer: the chunk sent back, [H, n, d]
    rewards: np.ndarray | None = None  # feedback: [m]
    terminated: np.ndarray | None = None
    truncated: np.ndarray | None = None


@dataclass(frozen=True)
class Report:
    """The verdict of one run, clause by clause, with notes that are not failures."""

    script: tuple[str, ...]
    connections: int
    clauses: tuple[ClauseResult, ...]
    notes: tuple[str, ...]
    incomplete: str | None  # why the script did not run to its end, if it did not
    transcript: tuple[Exchanged, ...] = ()  # every message, when the settings keep a transcript

    def clause(self, name: str) -> ClauseResult:
        for result in self.clauses:
            if result.name == name:
                return result
        raise KeyError(f"no clause named {name!r}; clauses are {', '.join(CLAUSES)}")

    @property
    def passed(self) -> int:
        """The number of clauses that passed (exercised, no failure)."""
        return sum(1 for c in self.clauses if c.status == "PASS")

    @property
    def failed(self) -> int:
        """The number of clauses with at least one failed check."""
        return sum(1 for c in self.clauses if c.status == "FAIL")

    def text(self) -> str:
        lines = [f"plugrl-test-trainer report: script {','.join(self.script)}; {self.connections} connection(s)"]
        width = max(len(name) for name in CLAUSES)
        for c in self.clauses:
            if c.status == "not exercised":
                lines.append(f"----  {c.name:<{width}}  not exercised")
                continue
            counts = (
                f"{c.checks} check{'s' if c.checks != 1 else ''}"
                if not c.failed
                else f"{c.passed} passed, {c.failed} failed"
            )
            lines.append(f"{c.status}  {c.name:<{width}}  ({counts})")
            for detail in c.failures[:_SHOWN_DETAILS]:
                lines.append(f"        - {detail}")
            if c.failed > _SHOWN_DETAILS:
                lines.append(f"        ... and {c.failed - _SHOWN_DETAILS} more")
        if self.incomplete:
            lines.append(f"script incomplete: {self.incomplete}")
        if self.notes:
            lines.append("notes:")
            lines.extend(f"  - {note}" for note in self.notes)
        lines.append(f"{self.passed} passed, {self.failed} failed")
        return "\n".join(lines)


class Recorder:
    """Counts checks per clause while the run goes on; :meth:`report` takes a snapshot."""

    def __init__(self) -> None:
        self._passed = dict.fromkeys(CLAUSES, 0)
        self._failed = dict.fromkeys(CLAUSES, 0)
        self._details: dict[str, list[str]] = {c: [] for c in CLAUSES}
        self._notes: dict[str, str] = {}
        self.incomplete: str | None = None
        self.transcript: list[Exchanged] | None = None  # a list when the settings keep a transcript

    def exchanged(self, entry: Exchanged) -> None:
        if self.transcript is not None:
            self.transcript.append(entry)

    def ok(self, clause: str) -> None:
        self._passed[clause] += 1

    def fail(self, clause: str, detail: str) -> None:
        self._failed[clause] += 1
        if len(self._details[clause]) < _MAX_STORED_DETAILS:
            self._details[clause].append(detail)

    def check(self, clause: str, where: str, problems: Sequence[str]) -> bool:
        """One check of ``clause``: passed when ``problems`` is empty."""
        if problems:
            self.fail(clause, f"{where}: " + "; ".join(problems))
            return False
        self.ok(clause)
        return True

    def note(self, text: str, key: str | None = None) -> None:
        """Something worth knowing that is not a failure; a note with the same key is kept once."""
        self._notes.setdefault(key or text, text)

    def report(self, script: tuple[str, ...], connections: int) -> Report:
        clauses = tuple(ClauseResult(c, self._passed[c], self._failed[c], tuple(self._details[c])) for c in CLAUSES)
        transcript = tuple(self.transcript or ())
        return Report(script, connections, clauses, tuple(self._notes.values()), self.incomplete, transcript)
