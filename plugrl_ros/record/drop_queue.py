"""A bounded hand-off from the control thread to the writer that drops, and counts, instead of blocking.

The budget is in bytes, because one camera frame weighs as much as
thousands of reward messages: a count limit would either let frames eat the
robot's memory or throw away small records for nothing. Large items (frames)
may only fill the budget up to a reserve, so that when the writer falls
behind the frames go first and the small records that make up a transition
(actions, rewards, flags, episode ends) still get through.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

LARGE_ITEM_BYTES = 64 * 1024


@dataclass(frozen=True)
class QueueCounts:
    accepted: int
    dropped: int
    dropped_large: int
    queued_items: int
    queued_bytes: int


class DropQueue(Generic[T]):
    """Many producers put without ever waiting on the consumer; one consumer takes everything queued."""

    def __init__(self, max_bytes: int, max_items: int = 100_000, reserve_fraction: float = 0.25) -> None:
        assert max_bytes > 0 and max_items > 0 and 0.0 <= reserve_fraction < 1.0
        self._max_bytes = max_bytes
        self._large_limit = int(max_bytes * (1.0 - reserve_fraction))
        self._max_items = max_items
        self._items: deque[tuple[int, T, int]] = deque()  # (number, item, size)
        self._number = 0
        self._bytes = 0
        self._closed = False
        self._accepted = 0
        self._dropped = 0
        self._dropped_large = 0
        # The lock is held only to append or to swap the deque out: never while writing.
        self._cond = threading.Condition(threading.Lock())

    def put(self, item: T, size: int) -> int:
        """Queue ``item`` (weighing ``size`` bytes) if it fits the budget; its number, negative if dropped.

        Every put gets the next number, dropped or not, under the same lock
        that orders the queue: numbers are in queue order even with several
        producers, and a gap in the numbers written is exactly the drops.
        """
        with self._cond:
            self._number += 1
            limit = self._large_limit if size >= LARGE_ITEM_BYTES else self._max_bytes
            if self._closed or self._bytes + size > limit or len(self._items) >= self._max_items:
                self._dropped += 1
                if size >= LARGE_ITEM_BYTES:
                    self._dropped_large += 1
                return -self._number
            self._items.append((self._number, item, size))
            self._bytes += size
            self._accepted += 1
            self._cond.notify()
            return self._number

    def take_all(self, timeout_s: float) -> list[tuple[int, T, int]] | None:
        """Everything queued, as (number, item, size), waiting up to ``timeout_s`` for something.

        None once closed and drained.

        The items' bytes stay on the budget until :meth:`release`: a writer
        stuck on a batch it took must still make the queue fill and drop.
        """
        with self._cond:
            if not self._items and not self._closed:
                self._cond.wait(timeout_s)
            if not self._items:
                return None if self._closed else []
            items, self._items = self._items, deque()
        return list(items)

    def release(self, size: int) -> None:
        """An item taken earlier is written (or discarded): its bytes leave the budget."""
        with self._cond:
            self._bytes -= size
            assert self._bytes >= 0

    def wake(self) -> None:
        """Make a waiting :meth:`take_all` return now (with whatever is queued, perhaps nothing)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """No more puts (they count as dropped); the consumer drains what is queued, then gets None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def counts(self) -> QueueCounts:
        with self._cond:
            return QueueCounts(self._accepted, self._dropped, self._dropped_large, len(self._items), self._bytes)
