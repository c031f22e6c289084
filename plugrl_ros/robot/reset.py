"""Resetting one env after its episode ends: a service call, an operator's ready signal, or nothing.

The procedure never blocks the executor: the service is called with
``call_async`` and polled from the control loop, with a timeout and retries
with exponential backoff. A robot whose reset keeps failing stays out of the
batch (it holds no action, so nobody waits for it) and is reported, while the
other robots keep training.

Only calls back off. A service not yet discovered (a bridge just started:
DDS discovery takes seconds on a busy machine; a robot restarting) is waited
for, looked up on every poll (a local lookup: nothing reaches the robot) and
called the moment it appears; after each ``timeout_s`` without it the reset is
reported failing. So the first failed call waits ``retry_initial_s``, however
long the service took to appear.

Nor is the service called before the env's topics have matched the robot's
publishers: the robot answers a reset by publishing, and a message sent before
DDS matched the bridge's subscription reaches nobody (a lockstep robot then
waits for a command for ever). Discovery matches endpoints one by one, so a
service may be found seconds before the topics are; after ``timeout_s`` with the
service there but a topic still unmatched, the reset is called anyway.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from rclpy.node import Node
from std_msgs.msg import Bool

from plugrl_ros.protocol.backoff import Backoff
from plugrl_ros.ros.config import ResetConfig, env_topic
from plugrl_ros.ros.qos import qos_profile

# A reset waiting this long for the robot's publishers to match says so (discovery takes 0.5-3 s here).
_PUBLISHERS_NOTICE_S = 3.0


class ResetState(enum.Enum):
    IDLE = "idle"
    DISCOVERING = "waiting for the reset service"
    CALLING = "calling"
    RETRY_WAIT = "waiting to retry"
    WAITING_SIGNAL = "waiting for the ready signal"


class ResetProcedure:
    """One env's reset, driven by :meth:`poll` from the control loop."""

    def __init__(
        self,
        node: Node,
        namespace: str,
        config: ResetConfig,
        clock_s: Callable[[], float],
        callback_group: object,
        unmatched: Callable[[], list[str]] = list,
        on_answer: Callable[[], None] | None = None,
    ) -> None:
        """``unmatched``: the env's topics that no publisher has matched yet (the reset waits for them).
        ``on_answer``: called on the executor thread when the service answers, so whoever drives the reset
        polls it then instead of at its next timer tick (in lockstep a reset is on every episode's path)."""
        self._config = config
        self._unmatched = unmatched
        self._on_answer = on_answer
        self.awaiting_publishers: list[str] = []  # the service is there, these topics are not yet
        self._found_at: float | None = None  # when the service was found (the wait for topics counts from then)
        self._publishers_said = False
        self._clock_s = clock_s
        self._node = node
        self.state = ResetState.IDLE
        self.failures = 0  # consecutive
        self.total_failures = 0
        self.last_error = ""
        self._backoff = Backoff(config.retry_initial_s, config.retry_max_s, jitter=False)
        self._future = None
        self._deadline = 0.0
        self._retry_at = 0.0
        self._missing = 0  # "not available" reports while waiting for the service to appear
        self._ready_seq = 0
        self._ready_mark = 0
        self._client = None
        self.target = ""
        if config.mode == "service":
            assert config.call is not None
            self._call_config = config.call
            self.target = env_topic(namespace, config.service)
            self._client = node.create_client(config.call.srv_type, self.target, callback_group=callback_group)
        elif config.mode == "signal":
            self.target = env_topic(namespace, config.ready_topic)
            node.create_subscription(
                Bool, self.target, self._on_ready, qos_profile("reliable", 10), callback_group=callback_group
            )

    @property
    def busy(self) -> bool:
        return self.state is not ResetState.IDLE

    def start(self) -> None:
        """Begin resetting; :meth:`poll` reports completion."""
        assert not self.busy
        self.failures = 0
        self._backoff.reset()
        if self._config.mode == "service":
            self._call()
        elif self._config.mode == "signal":
            self._ready_mark = self._ready_seq
            self.state = ResetState.WAITING_SIGNAL
        # mode "none": a continuing task; nothing to do

    def poll(self) -> bool:
        """Advance the reset; True once it has completed (the procedure is then idle again)."""
        now = self._clock_s()
        if self.state is ResetState.IDLE:
            return True
        if self.state is ResetState.WAITING_SIGNAL:
            if self._ready_seq > self._ready_mark:
                self.state = ResetState.IDLE
                return True
            return False
        if self.state is ResetState.RETRY_WAIT:
            if now >= self._retry_at:
                self._call()
            return False
        if self.state is ResetState.DISCOVERING:
            assert self._client is not None
            if self._client.service_is_ready():
                # it is there now: only failed calls still count in a row (not the wait for the topics)
                self.failures -= self._missing
                self._missing = 0
                if self._topics_matched(now):
                    self._send()
            elif now >= self._deadline:
                self._report_missing(now)
            return False
        # CALLING
        future = self._future
        if future is not None and future.done():
            self._future = None
            exc = future.exception()
            if exc is not None:
                self._fail(f"the reset service raised {exc!r}")
                return False
            response = future.result()
            why = self._refused(response)
            if why:
                self._fail(why)
                return False
            self.failures = 0
            self.state = ResetState.IDLE
            return True
        if now >= self._deadline:
            if future is not None:
                self._forget(future)
                self._future = None
            self._fail(f"no answer from {self.target} within {self._config.timeout_s:g} s")
        return False

    def _refused(self, response: object) -> str:
        """Why the response says the reset failed ("" if it worked): its success field, by path, is false."""
        call = self._call_config
        if call.success is None or call.success.read(response)[0] != 0:
            return ""
        said = f": {call.message(response)!r}" if call.message is not None else ""
        return f"the reset service answered {call.success.text}=false{said}"

    def cancel(self) -> None:
        """Stop trying (shutdown)."""
        if self._future is not None:
            self._forget(self._future)
        self._future = None
        self.awaiting_publishers = []
        self.state = ResetState.IDLE

    def _forget(self, future: object) -> None:
        """Drop an unanswered call (a late answer must not count as the next attempt's)."""
        remove = getattr(self._client, "remove_pending_request", None)  # not in every distro's rclpy
        if remove is not None:
            remove(future)

    def _call(self) -> None:
        """Call the service, or wait for it (and the env's topics) to be discovered."""
        assert self._client is not None
        self._future = None
        now = self._clock_s()
        self._deadline = now + self._config.timeout_s
        self._missing = 0
        self._found_at = None
        self.state = ResetState.DISCOVERING
        if self._client.service_is_ready() and self._topics_matched(now):
            self._send()

    def _topics_matched(self, now: float) -> bool:
        """The service is there: are the env's topics matched too (or has the wait for them run out)?"""
        if self._found_at is None:
            self._found_at = now
        self.awaiting_publishers = self._unmatched()
        if not self.awaiting_publishers:
            self._publishers_said = False
            return True
        waited = now - self._found_at
        log = self._node.get_logger()
        if waited < self._config.timeout_s:
            if waited > _PUBLISHERS_NOTICE_S and not self._publishers_said:
                self._publishers_said = True  # (discovery takes a second or two: only a longer wait is news)
                log.info(
                    f"{self.target}: waiting for the robot's publishers on {', '.join(self.awaiting_publishers)} "
                    "before calling it (its answer would be lost)"
                )
            return False
        log.warning(
            f"{self.target}: no publisher on {', '.join(self.awaiting_publishers)} {waited:.1f} s after the service "
            f"appeared (reset.timeout_s {self._config.timeout_s:g}); calling it anyway"
        )
        self.awaiting_publishers = []
        self._publishers_said = False
        return True

    def _send(self) -> None:
        assert self._client is not None
        self.awaiting_publishers = []
        self._future = self._client.call_async(self._call_config.make_request())
        if self._on_answer is not None:
            on_answer = self._on_answer
            self._future.add_done_callback(lambda _: on_answer())
        self._deadline = self._clock_s() + self._config.timeout_s
        self.state = ResetState.CALLING

    def _report_missing(self, now: float) -> None:
        """The service is still not discovered after ``timeout_s``: report it and keep waiting (no backoff)."""
        self._missing += 1
        self.failures += 1
        self.total_failures += 1
        self.last_error = f"the reset service {self.target} is not available"
        self._deadline = now + self._config.timeout_s
        self._node.get_logger().warning(
            f"reset of {self.target} failed ({self.failures} in a row): {self.last_error}"
            f" after {self._config.timeout_s:g} s; calling it as soon as it appears"
        )

    def _fail(self, error: str) -> None:
        """A call failed: retry after the next backoff delay."""
        self.failures += 1
        self.total_failures += 1
        self.last_error = error
        delay = self._backoff.next_delay()
        self._retry_at = self._clock_s() + delay
        self.state = ResetState.RETRY_WAIT
        self._node.get_logger().warning(
            f"reset of {self.target} failed ({self.failures} in a row): {error}; retrying in {delay:.1f} s"
        )

    def _on_ready(self, msg: Bool) -> None:
        if msg.data:
            self._ready_seq += 1
