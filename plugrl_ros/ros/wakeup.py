"""Running a callback on the node's executor thread at the request of another thread, on any rclpy executor.

A link thread (the trainer's, the policy servers') hands its events to the
executor this way. A guard condition would do it on rclpy's waitset
executors, but the EventsExecutor refuses guard conditions; both kinds take a
task from another thread (``Executor.create_task`` is thread-safe: a lock
and the executor's own wakeup in rclpy's Python executors, a locked event
queue in the EventsExecutor), so that is what a wakeup posts.
"""

from __future__ import annotations

from collections.abc import Callable

from rclpy.node import Node


class Wakeup:
    """``trigger()`` from any thread: ``callback()`` runs soon on the executor thread of ``node``.

    A wakeup posted before the node joins an executor (a link connecting while
    the node is built), or lost in rcl (a guard condition triggered from
    another thread failed to wake a waitset executor about once in 20,000
    chunks), is caught up by a timer every ``fallback_period_s``: ``callback``
    must drain whatever is queued, and be cheap when nothing is.
    """

    def __init__(
        self, node: Node, callback: Callable[[], None], callback_group: object, fallback_period_s: float
    ) -> None:
        self._node = node
        self._callback = callback
        # Called with no argument, whatever ``callback`` accepts: rclpy's EventsExecutor hands a timer's
        # TimerInfo to a callback that takes a parameter (an optional one too, which then reads it as its value).
        node.create_timer(fallback_period_s, self._fallback, callback_group=callback_group)

    def _fallback(self) -> None:
        self._callback()

    def trigger(self) -> None:
        executor = self._node.executor
        if executor is not None:  # not added yet, or already gone: the timer delivers
            executor.create_task(self._callback)
