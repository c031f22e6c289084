"""Errors of the protocol layer: what the peer broke, and what we must not do."""

from __future__ import annotations


class ProtocolError(Exception):
    """The trainer sent something the protocol does not allow; names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class FatalServerError(Exception):
    """The trainer signalled a fatal error (a text frame): close and send nothing more."""


class ProtocolMisuse(AssertionError):
    """Our own code tried to break a protocol rule; raised before anything is sent."""
