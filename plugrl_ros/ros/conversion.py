"""What a converter raises when a message does not fit the configuration (the env waits; nothing crashes)."""

from __future__ import annotations


class ConversionError(Exception):
    """A message that does not fit the configuration (a missing joint, a too-short array, a bad image)."""


class ShortMessage(ConversionError):
    """A variable-length field is shorter than a configured path reads: the env waits (WARN), never pads."""
