"""The last line of defence of every thread the package runs: an error nobody expected becomes the process's.

A link thread that dies leaves a process that looks alive (its node spins,
its diagnostics say "not connected") but will never connect again: nothing
restarts a thread. A process that exits non-zero is restarted by whatever
started it (``respawn`` in a launch file, systemd, Ray). So every thread's
body runs behind :func:`guarded`: whatever escapes it is reported, with its
traceback, to an ``on_crash`` that logs it at ERROR and ends the process
with :data:`EXIT_CRASHED`. Failures that are expected (a lost connection, a
full disk) are handled where they happen and never reach this far.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

# sysexits' EX_SOFTWARE ("an internal software error"): neither success (0), nor a fatal
# error the peer reported (1), nor a configuration the user can fix (2)
EXIT_CRASHED = 70

log = logging.getLogger("plugrl_ros")


@dataclass(frozen=True)
class Crash:
    """An exception that ended thread ``thread``: what it was, and where it came from."""

    thread: str
    error: str
    traceback: str

    def message(self) -> str:
        """The ERROR line for the log: what died, why, that the process exits, and the traceback."""
        return (
            f"the {self.thread} thread died of an unexpected error ({self.error}); the process exits with "
            f"{EXIT_CRASHED} so that it is restarted (launch respawn, systemd)\n{self.traceback.rstrip()}"
        )


def guarded(target: Callable[[], object], thread: str, on_crash: Callable[[Crash], None]) -> Callable[[], None]:
    """``target`` behind the last line of defence: what escapes it goes to ``on_crash`` as a :class:`Crash`.

    ``on_crash`` runs on the dying thread; it must log the crash at ERROR and
    make the process exit with :data:`EXIT_CRASHED` (a node: end its spin
    loop). Should it fail too, the crash is written to stderr, so it is never lost.
    """

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # the last line of defence: nothing may end a thread unseen
            crash = crash_of(thread, exc)
            try:
                on_crash(crash)
            except BaseException:  # reporting failed too: stderr is all that is left
                print(crash.message(), file=sys.stderr, flush=True)
                traceback.print_exc()

    return run


def crash_of(thread: str, exc: BaseException) -> Crash:
    """``exc``, which ended thread ``thread``, as a :class:`Crash` with its traceback."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Crash(thread, f"{type(exc).__name__}: {exc}"[:500], text)


def log_crash(crash: Crash) -> None:
    """The default report, where no node logs for the thread: Python logging at ERROR (stderr if unconfigured)."""
    log.error(crash.message())
