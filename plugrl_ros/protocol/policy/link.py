"""Policy clients, one per robot, on one asyncio thread of their own; events handed back in order.

The control loop must never wait on the network, and one robot's slow or
dead server must not hold back another's: every robot gets its own
connection (policy servers do not batch robots), all of them served by one
event loop on a background thread. Commands go in with
``call_soon_threadsafe``; events come back through a queue, and ``wake`` is
called after each one so the consumer (a ROS node passes its guard
condition's ``trigger``) can :meth:`PolicyLinks.drain` them on its own
thread. Encoding an observation happens on the link thread, off the control loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plugrl_ros.protocol.client import ClientSettings
from plugrl_ros.protocol.policy.client import Event, PolicyClient
from plugrl_ros.protocol.policy.session import Expectation
from plugrl_ros.thread_guard import Crash, guarded, log_crash


class PolicyLinks:
    """One connection per robot: robot ``i`` connects as ``settings[i]`` says and expects ``expectations[i]``."""

    def __init__(
        self,
        settings: Sequence[ClientSettings],
        expectations: Sequence[Expectation],
        wake: Callable[[], None],
        on_crash: Callable[[Crash], None] = log_crash,
    ) -> None:
        """``on_crash`` hears, on the link thread, an error nobody expected that ended it (see :mod:`thread_guard`)."""
        assert expectations and len(settings) == len(expectations), "one ClientSettings and Expectation per robot"
        self._wake = wake
        self._events: deque[tuple[int, Event]] = deque()
        self._loop = asyncio.new_event_loop()
        # asyncio primitives bind to a loop on first use, so the clients may be built here
        self._clients = [
            PolicyClient(link, expect, lambda event, robot=robot: self._emit(robot, event))
            for robot, (link, expect) in enumerate(zip(settings, expectations, strict=True))
        ]
        run = guarded(self._run, "policy link", on_crash)
        self._thread = threading.Thread(target=run, name="plugrl-policy-links", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._run_clients())
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    async def _run_clients(self) -> None:
        """Each robot's client as a task of its own, until every one has stopped.

        A client ends only when stopped: every way a connection can fail is a
        lost connection it reconnects from, for its robot alone. An error that
        escapes one is a bug, and ends the thread (then the process) with the
        robot named, rather than leave the other robots driven by a half-dead link.
        """
        tasks = [asyncio.ensure_future(self._run_client(robot, c)) for robot, c in enumerate(self._clients)]
        try:
            for finished in asyncio.as_completed(tasks):
                await finished
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    async def _run_client(robot: int, client: PolicyClient) -> None:
        try:
            await client.run()
        except Exception as exc:
            exc.add_note(f"(in robot {robot}'s policy client)")
            raise

    def _emit(self, robot: int, event: Event) -> None:
        self._events.append((robot, event))
        self._wake()

    def drain(self) -> list[tuple[int, Event]]:
        """The events since the last drain, oldest first, each with its robot's index."""
        events = []
        while self._events:
            events.append(self._events.popleft())
        return events

    def _call(self, fn: Callable[..., object], *args: object) -> None:
        if self._loop.is_closed():
            return  # the clients have finished; there is nobody to tell
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed between the check and the call
            pass

    def request(self, robot: int, epoch: int, observation: Mapping[str, Any], tag: Any) -> None:
        """Send robot ``robot``'s observation on its connection ``epoch`` (dropped if that connection is gone)."""
        self._call(self._clients[robot].request, epoch, observation, tag)

    def abort(self, robot: int, epoch: int, detail: str) -> None:
        """Close robot ``robot``'s connection ``epoch`` and reconnect with backoff."""
        self._call(self._clients[robot].abort, epoch, detail)

    def stop(self) -> None:
        """Close every connection with 1000; the thread then ends."""
        for client in self._clients:
            self._call(client.stop)

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end; False if it is still running."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
