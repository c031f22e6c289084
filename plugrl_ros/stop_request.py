"""Ctrl-C and SIGTERM as a request to stop: recorded and announced, never raised.

A signal handler that raises (Python's default KeyboardInterrupt) interrupts
whatever runs at that moment: rclpy's C code (then ``SystemError: ...
returned a result with an exception set``), a shutdown the first signal had
started (a terminal's Ctrl-C under ``ros2 launch`` reaches a node twice: from
the terminal and forwarded by launch), a results file half written, an import
(CPython then may lose the exception altogether). So every executable of the
package installs these handlers before anything else: they only record the
request and call the wake-ups registered by whoever waits (an executor loop,
an event loop), which end their run the normal way: actuators idled,
connections closed with 1000, results written, exit status 0. Further
signals find the request already made and change nothing.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by every executable before anything else: keep it light
    import asyncio
    import subprocess

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# Touched by the signal handler, which runs between two bytecodes of the main
# thread: list appends and reads are atomic there and take no lock.
_requests: list[int] = []
_wakers: list[Callable[[], None]] = []


def install() -> None:
    """Handle SIGINT and SIGTERM from now on (call from the main thread; again is harmless).

    Also when a shell started the process with SIGINT ignored (a background job): whoever stops
    it with SIGINT (a test, a supervisor) means it.
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_signal)


def _on_signal(signum: int, frame: object) -> None:
    request(signum)


def request(signum: int = signal.SIGINT) -> None:
    """Request a stop as the signal ``signum`` does (for one that arrived before :func:`install`)."""
    # Whether this is the first request is read before it is recorded. A second signal's handler may run
    # inside this one, between any two bytecodes (a terminal's Ctrl-C and launch's come together): read after
    # the append, each handler would see the other's request too, and neither would wake anyone.
    first = not _requests
    _requests.append(signum)
    if first:
        for wake in list(_wakers):
            wake()


def ignore_from_now() -> None:
    """The process is ending: from now on SIGINT and SIGTERM change nothing.

    While Python finalizes it restores the default handlers of the signals it
    handled, and a Ctrl-C then (a terminal's arriving after launch's, say)
    would kill the process with status -2; ignored signals stay ignored.
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def requested() -> bool:
    """Whether SIGINT or SIGTERM has arrived since :func:`install`."""
    return bool(_requests)


@contextmanager
def waking(wake: Callable[[], None]) -> Iterator[None]:
    """Call ``wake`` when a stop is requested during the block (at once if one already was).

    ``wake`` runs inside the signal handler, on the main thread, between any two
    bytecodes: it must be quick, take no lock the main thread may hold, never
    raise, and tolerate being called twice.
    """
    _wakers.append(wake)
    try:
        if _requests:
            wake()
        yield
    finally:
        _wakers.remove(wake)


@contextmanager
def calling_in_loop(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> Iterator[None]:
    """Run ``callback`` on ``loop`` (an event loop of this process) when a stop is requested during the block."""

    def wake() -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(callback)

    with waking(wake):
        yield


def stop_child(process: subprocess.Popen, timeout: float) -> int:
    """Stop a child process of the package as a Ctrl-C stops it; its exit status (0 where our signal ended it).

    SIGTERM, then, after ``timeout``, kill (never -9 first: DDS leaves
    shared-memory files behind). The child's handlers (:func:`install`) take
    SIGTERM as they take Ctrl-C. Before they exist (a child stopped in Python's
    own start-up) SIGTERM ends it at once, where SIGINT would raise
    KeyboardInterrupt inside the interpreter's initialisation and exit 1 as if
    it had failed.
    """
    import subprocess

    if process.poll() is not None:
        return process.returncode
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
    code = process.wait()
    # stopped before its handlers existed: our SIGTERM ended it, not a fault
    return 0 if code == -signal.SIGTERM else code
