"""The trainer connection on its own asyncio thread, handed to the ROS executor through a wakeup.

The websocket client must keep answering the trainer while ROS callbacks run,
and the control loop must never wait on the network, so the client gets a
thread and an event loop of its own. Its events are queued and a wakeup
(:mod:`plugrl_ros.ros.wakeup`) has the executor deliver them in order; commands go the other
way with ``call_soon_threadsafe``. Encoding (the heavy part of sending an
observation) happens on the client's thread, off the control loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rclpy.node import Node

from plugrl_ros.protocol.client import ClientSettings, CloseKind, Event, TrainerClient
from plugrl_ros.protocol.connection import Outgoing
from plugrl_ros.ros.wakeup import Wakeup
from plugrl_ros.thread_guard import Crash, guarded


@dataclass(frozen=True)
class Finished:
    """The client stopped for good: the run finished, a fatal error, or we stopped it."""

    kind: CloseKind
    detail: str


LinkEvent = Event | Finished

# A lost wakeup would leave an event here until the trainer's feedback timeout.
_FALLBACK_DRAIN_S = 0.02


class TrainerLink:
    """Owns the client thread; ``on_event`` is called on the executor thread, in order."""

    def __init__(
        self,
        node: Node,
        settings: ClientSettings,
        on_event: Callable[[LinkEvent], None],
        callback_group: object,
        on_crash: Callable[[Crash], None],
    ) -> None:
        """``on_crash`` hears, on the link thread, an error nobody expected that ended it (see :mod:`thread_guard`)."""
        self._on_event = on_event
        self._events: deque[LinkEvent] = deque()
        self._wakeup = Wakeup(node, self._deliver, callback_group, _FALLBACK_DRAIN_S)
        self._loop = asyncio.new_event_loop()
        # asyncio primitives bind to a loop on first use, so the client may be
        # built here and run on the link thread.
        self._client = TrainerClient(settings, self._emit)
        run = guarded(self._run, "trainer link", on_crash)
        self._thread = threading.Thread(target=run, name="plugrl-trainer-link", daemon=True)

    @property
    def client(self) -> TrainerClient:
        return self._client

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            kind = self._loop.run_until_complete(self._client.run())
            self._emit(Finished(kind, self._client.fatal_detail or ""))
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def _emit(self, event: LinkEvent) -> None:
        self._events.append(event)
        self._wakeup.trigger()

    def _deliver(self) -> None:
        while self._events:
            self._on_event(self._events.popleft())

    def undelivered(self) -> list[LinkEvent]:
        """The events the executor has not delivered, oldest first, taken from the queue.

        After :meth:`join` at shutdown the executor no longer spins, so the link's last events (its close)
        would never reach ``on_event`` otherwise.
        """
        events = []
        while self._events:
            events.append(self._events.popleft())
        return events

    def _call(self, fn: Callable[..., object], *args: object) -> None:
        if self._loop.is_closed():
            return  # the client has finished; there is nobody to tell
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed between the check and the call
            pass

    def send(self, epoch: int, outgoing: Sequence[Outgoing]) -> None:
        """Queue ``outgoing`` (a feedback and the infer after it, usually) for connection ``epoch``: one hand-over
        to the link's loop for all of them (each is a write to its wake-up pipe, taken under the GIL)."""
        if outgoing:
            self._call(self._send_all, epoch, tuple(outgoing))

    def _send_all(self, epoch: int, outgoing: tuple[Outgoing, ...]) -> None:
        for message in outgoing:
            self._client.send(epoch, message)

    def abort(self, epoch: int, detail: str, code: int = 1002, slowly: bool = False) -> None:
        self._call(self._client.abort, epoch, detail, code, slowly)

    def stop(self) -> None:
        self._call(self._client.stop)

    def join(self, timeout: float) -> bool:
        """Wait for the client thread to end; False if it is still running."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
