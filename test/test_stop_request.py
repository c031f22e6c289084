"""The stop request's bookkeeping: a Ctrl-C wakes whoever waits, whatever the moment it comes.

Signal handlers run between two bytecodes of the main thread, so a second signal's handler may run inside
the first's (a terminal's Ctrl-C and launch's forwarded one come together). Which bytecodes they fall
between cannot be timed from outside: here the second handler runs at a chosen point, through the list
that records the requests. test_signals sends real signals to the installed executables.
"""

from __future__ import annotations

import signal

import pytest

from plugrl_ros import stop_request


class _SecondSignal(list):
    """The request list, with a second SIGINT's handler running right before or right after the first's
    append (the handler reads and appends to the list: it may come between any two of its steps)."""

    def __init__(self, after: bool) -> None:
        super().__init__()
        self._after = after
        self._interrupted = False

    def append(self, signum: int) -> None:
        nested = not self._interrupted  # only the first append is interrupted
        self._interrupted = True
        if nested and not self._after:
            stop_request.request(signal.SIGINT)
        super().append(signum)
        if nested and self._after:
            stop_request.request(signal.SIGINT)


@pytest.mark.parametrize("after", [False, True], ids=["before-the-append", "after-the-append"])
def test_a_second_signal_inside_the_first_ones_handler_still_wakes_the_waiter(monkeypatch, after):
    monkeypatch.setattr(stop_request, "_requests", _SecondSignal(after))
    monkeypatch.setattr(stop_request, "_wakers", [])
    woken = []
    with stop_request.waking(lambda: woken.append(True)):
        assert not woken
        stop_request.request(signal.SIGINT)
    assert stop_request.requested()
    # once at least (a waker tolerates two calls); an earlier version read the count after the append, and
    # with the second signal there both handlers saw two requests and woke nobody: the trainer ran on
    assert 1 <= len(woken) <= 2, woken


def test_later_signals_wake_nobody_again_and_a_waiter_registered_after_a_request_is_woken_at_once(monkeypatch):
    monkeypatch.setattr(stop_request, "_requests", [])
    monkeypatch.setattr(stop_request, "_wakers", [])
    woken = []
    with stop_request.waking(lambda: woken.append("first")):
        stop_request.request(signal.SIGINT)
        stop_request.request(signal.SIGTERM)
    assert woken == ["first"]
    with stop_request.waking(lambda: woken.append("late")):
        pass
    assert woken == ["first", "late"]
