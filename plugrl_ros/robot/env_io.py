"""One env's ROS side and all its per-env state: sensor subscriptions, reward and done topics, actuators, reset.

Subscription callbacks only store the newest message (and count it); the
conversion to numpy happens when an observation is actually needed, at most
once per message. A costly image conversion (a JPEG decode, a resize) is
started on a worker thread as the message arrives, if the bridge gives one:
OpenCV releases the GIL, so it runs beside the executor instead of on the
control tick, which then only collects the result (or its ConversionError,
exactly as if it had converted the message itself). Freshness is judged on
arrival order and age: an env never steps on a source older than its
``max_age_s``, and after a reset (or, in lockstep, after an action) it waits
for messages newer than that moment.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np
from rclpy.duration import Duration
from rclpy.node import Node
from std_msgs.msg import Bool, Float32, Float64

from plugrl_ros.protocol.backoff import Backoff
from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.robot.goal_actuator import GoalActuator, GoalGate
from plugrl_ros.robot.reset import ResetProcedure
from plugrl_ros.robot.silence import SilenceWatch
from plugrl_ros.ros.config import BridgeConfig, TopicConfig, env_topic
from plugrl_ros.ros.conversion import ConversionError, ShortMessage
from plugrl_ros.ros.qos import qos_profile, subscription_event_callbacks
from plugrl_ros.ros.sinks import GoalSink

# An actuator without a subscriber for this long is reported (DDS matches a new pair in well under that).
_UNHEARD_WARNING_S = 3.0
# A topic counts as matched (a reset may be called) this long after its publisher matched the bridge's reader.
_MATCH_SETTLE_S = 1.0


class Latest:
    """The newest message on one subscription: its arrival count, time, and (cached) conversion."""

    __slots__ = ("_converted", "_converted_seq", "_pending", "_pending_seq", "msg", "seq", "stamp_ns")

    def __init__(self) -> None:
        self.msg: Any = None
        self.seq = 0
        self.stamp_ns = 0
        self._converted: Any = None
        self._converted_seq = -1
        self._pending: Future | None = None
        self._pending_seq = -1

    def store(self, msg: Any, stamp_ns: int) -> None:
        self.msg = msg
        self.seq += 1
        self.stamp_ns = stamp_ns

    def prefetch(self, converter: Any, pool: Executor) -> None:
        """Start converting the newest message on ``pool``; :meth:`converted` collects the result."""
        if self._pending is not None:
            self._pending.cancel()  # superseded: no use decoding it if it has not started
        try:
            self._pending = pool.submit(converter.convert, self.msg)
        except RuntimeError:  # the pool is shut down: the node is stopping
            self._pending = None
            return
        self._pending_seq = self.seq

    def converted(self, converter: Any) -> Any:
        if self._converted_seq != self.seq:
            pending, self._pending = self._pending, None
            if pending is not None and self._pending_seq == self.seq:
                # the same conversion, done elsewhere: it raises what convert() raises
                self._converted = pending.result()
            else:
                self._converted = converter.convert(self.msg)
            self._converted_seq = self.seq
        return self._converted


class ShapeGuard:
    """Every env's observation must keep one shape per name, or the batch cannot be stacked."""

    def __init__(self) -> None:
        self._shapes: dict[str, tuple[int, ...]] = {}

    def check(self, name: str, array: np.ndarray) -> None:
        expected = self._shapes.setdefault(name, array.shape)
        if array.shape != expected:
            raise ConversionError(
                f"{name} has shape {list(array.shape)}, but earlier observations had {list(expected)} "
                "(every env and every step must match; configure resize for images)"
            )


class _Source:
    __slots__ = ("config", "latest", "matched_at", "subscription", "topic")

    def __init__(self, config: TopicConfig, topic: str) -> None:
        self.config = config
        self.topic = topic
        self.latest = Latest()
        self.subscription: Any = None
        self.matched_at: float | None = None  # when a publisher was first seen matched (monotonic)


class EnvIO:
    """Subscriptions, publishers and reset procedure of env ``index`` under ``namespace``."""

    def __init__(
        self,
        node: Node,
        index: int,
        namespace: str,
        config: BridgeConfig,
        shapes: ShapeGuard,
        callback_group: object,
        on_input: Callable[[int], None],
        clock_s: Callable[[], float],
        converter_pool: Executor | None = None,
    ) -> None:
        self.index = index
        self.namespace = namespace
        self._node = node
        self._config = config
        self._shapes = shapes
        self._on_input = on_input
        self._lockstep = config.control.mode == "lockstep"
        # Why the last observation did not convert, until one does (staleness is not kept: see stale_sources).
        self.conversion_problem = ""
        # The outcome of the step in flight could not be observed (stale, or a conversion failed):
        # once it can be, the chunk is cut (the rest of it was planned for an old state).
        self.interrupted = False
        self.resetting = False  # a reset procedure runs (started by the robot side, not yet done)
        self.recovering = False  # that reset was started for silence (see plugrl_ros.robot.silence)
        # The env has moved (a step published, or a chunk started from an observation) since its last reset:
        # from then on a reset would cut an episode, so silence is reported but never answered with one.
        self.moved = False
        self.silence = SilenceWatch(
            Backoff(config.reset.retry_initial_s, config.reset.retry_max_s, jitter=False),
            can_reset=config.reset.mode != "none",
        )
        self.nonfinite_actions = 0
        self._clock_s = clock_s
        self.step_sent_s = 0.0  # when the last step went out (monotonic)
        self._group = callback_group
        self._converter_pool = converter_pool

        episode = config.episode
        self._flags = {"terminated": False, "truncated": False, "success": False}
        self._flag_sources: dict[str, _Source] = {}
        if episode.success_topic:
            # Subscribed first: the executor runs ready callbacks in subscription order, so a
            # success published with (or before) a step's other results is counted in that step,
            # not in the one after it, even in lockstep where those results end the step.
            self._subscribe_flag("success", episode.success_topic, sync=False)

        self._images = [
            # images are taken serialized: their sources read the pixels in place (one copy, not three)
            (image.name, self._subscribe(image.source, 5, prefetch=image.source.converter.costly, raw=True))
            for image in config.images
        ]
        self._states = [
            # joint states, too, are taken serialized and read in place (names decoded only when they change)
            (state.name, [self._subscribe(part, 5, raw=part.converter.raw) for part in state.parts])
            for state in config.states
        ]
        self._text = self._subscribe(config.text.source, 5) if config.text.source else None
        self._observed: list[_Source] = [s for _, s in self._images] + [p for _, parts in self._states for p in parts]
        if self._text is not None:
            self._observed.append(self._text)

        reward = config.reward
        self._reward_sum = 0.0
        self._reward_latest = 0.0
        self._reward_source: _Source | None = None
        if reward.topic:
            reward_type = Float32 if reward.type_name == "std_msgs/Float32" else Float64
            reward_config = TopicConfig(
                "reward", reward.topic, reward.type_name, reward.qos, reward.max_age_s, None, reward.sync
            )
            self._reward_source = self._subscribe(reward_config, 100, reward_type, self._on_reward)
        for flag, topic in (("terminated", episode.terminated_topic), ("truncated", episode.truncated_topic)):
            if topic:
                self._subscribe_flag(flag, topic, sync=episode.sync)

        # The sources a step's result must hear from after its action: in
        # lockstep every observation, the reward and the terminated flag; in
        # timer mode the topics configured as publishing once per step (sync).
        candidates = list(self._observed)
        if self._reward_source is not None:
            candidates.append(self._reward_source)
        candidates += [self._flag_sources[f] for f in ("terminated", "truncated") if f in self._flag_sources]
        if self._lockstep:
            self._step_sources = [s for s in candidates if s.config.key != "episode.truncated_topic"]
        else:
            self._step_sources = [s for s in candidates if s.config.sync]
        self._step_marks: list[int] | None = None
        self._fresh_marks: list[int] | None = None

        self._actuators = []
        self._wait_for_subscribers = config.control.wait_for_subscribers
        self._unheard_since_s: float | None = None
        self._unheard_warned_s = -math.inf
        self.goal_failures = 0
        for action in config.actions:
            topic = env_topic(namespace, action.topic)
            if isinstance(action.sink, GoalSink):
                publisher: Any = GoalActuator(
                    node,
                    action.sink.action_type,
                    topic,
                    GoalGate(action.sink.running_goal, action.sink.goal_period_s, action.sink.period_s),
                    callback_group,
                    clock_s,
                    functools.partial(self._goal_failed, action.key),
                )
            else:
                publisher = node.create_publisher(action.sink.msg_type, topic, qos_profile(action.qos, 10))
            self._actuators.append((action, publisher, action.make_shaper()))

        self.reset = ResetProcedure(
            node,
            namespace,
            config.reset,
            clock_s,
            callback_group,
            self.unmatched_sources,
            on_answer=lambda: on_input(index),  # the mode hears of it as of any input of the env
        )

    def _goal_failed(self, key: str, why: str) -> None:
        """An action server rejected or aborted a goal: the robot did not do what the trainer was told it
        did, so the episode is truncated (at the step this answer arrives in) and the operator warned."""
        self.goal_failures += 1
        self._flags["truncated"] = True
        self._node.get_logger().warning(f"env {self.index}: {key}: {why}; the episode is truncated")
        self._on_input(self.index)

    # -- subscriptions -----------------------------------------------------

    def _subscribe(
        self,
        config: TopicConfig,
        depth: int,
        msg_type: type | None = None,
        extra: Callable[[Any], None] | None = None,
        prefetch: bool = False,
        raw: bool = False,
    ) -> _Source:
        topic = env_topic(self.namespace, config.topic)
        source = _Source(config, topic)
        now_ns = self._node.get_clock().now
        pool = self._converter_pool if prefetch else None

        def callback(msg: Any) -> None:
            source.latest.store(msg, now_ns().nanoseconds)
            if pool is not None:
                source.latest.prefetch(config.converter, pool)
            if extra is not None:
                extra(msg)
            self._on_input(self.index)

        def incompatible(event: Any) -> None:
            self._node.get_logger().error(
                f"{config.key}: the publisher of {topic} offers a QoS this subscription ({config.qos}) cannot "
                f"accept (policy {event.last_policy_kind}); set {config.key.rsplit('.', 1)[0]}.qos to match it "
                "(best_effort/sensor_data accept every publisher)",
                throttle_duration_sec=30.0,
            )

        source.subscription = self._node.create_subscription(
            msg_type or config.converter.msg_type,
            topic,
            callback,
            qos_profile(config.qos, depth),
            callback_group=self._group,
            event_callbacks=subscription_event_callbacks(incompatible),
            raw=raw,
        )
        return source

    def _subscribe_flag(self, flag: str, topic: str, sync: bool) -> None:
        episode = self._config.episode
        flag_config = TopicConfig(f"episode.{flag}_topic", topic, "std_msgs/Bool", episode.qos, 0.0, None, sync)
        self._flag_sources[flag] = self._subscribe(flag_config, 100, Bool, self._flag_callback(flag))

    def _on_reward(self, msg: Any) -> None:
        self._reward_sum += msg.data
        self._reward_latest = msg.data

    def _flag_callback(self, flag: str) -> Callable[[Bool], None]:
        def callback(msg: Bool) -> None:
            if msg.data:
                self._flags[flag] = True

        return callback

    @property
    def topics(self) -> list[str]:
        return [s.topic for s in self._observed]

    # -- observing ---------------------------------------------------------

    def stale_sources(self, now_ns: int) -> list[str]:
        """The sources that keep this env from stepping: silent, too old, or older than a reset."""
        stale = []
        sources = list(self._observed)
        if self._reward_source is not None and self._config.reward.max_age_s > 0:
            sources.append(self._reward_source)
        for i, source in enumerate(sources):
            latest = source.latest
            if latest.seq == 0:
                stale.append(f"{source.topic} (no message yet)")
            elif self._fresh_marks is not None and i < len(self._fresh_marks) and latest.seq <= self._fresh_marks[i]:
                stale.append(f"{source.topic} (nothing new since the reset)")
            elif not self._lockstep and source.config.max_age_s > 0:
                age = (now_ns - latest.stamp_ns) * 1e-9
                if age > source.config.max_age_s:
                    stale.append(
                        f"{source.topic} (last message {age:.2f} s ago, max_age_s {source.config.max_age_s:g})"
                    )
        return stale

    def unheard_actuators(self) -> list[str]:
        """The actuator topics no subscriber has matched (yet, or any more): what they are sent is lost.

        Empty when ``control.wait_for_subscribers`` is off. Any subscriber counts (a driver, a recorder).
        """
        if not self._wait_for_subscribers:
            return []
        return [
            f"{publisher.topic_name} (action server)" if isinstance(publisher, GoalActuator) else publisher.topic_name
            for _, publisher, _ in self._actuators
            if publisher.get_subscription_count() == 0
        ]

    def unheard_problem(self) -> str:
        """What /diagnostics says of an actuator without a subscriber; empty if every one has one."""
        unheard = self.unheard_actuators()
        return f"no subscriber on {', '.join(unheard)} (commands would be lost)" if unheard else ""

    def silence_limit_s(self) -> float:
        """How long this env may go without a fresh observation before it is reported (0: forever).

        In lockstep, and before the env has moved since its reset, ``control.env_timeout_s`` (a robot
        answers a reset, then publishes). In timer mode once it has moved, its sources' smallest
        ``max_age_s``: an older message is stale, and the robot cannot step on it.
        """
        timeout = self._config.control.env_timeout_s
        if self._lockstep or not self.moved:
            return timeout
        ages = [s.config.max_age_s for s in self._observed if s.config.max_age_s > 0]
        return min(ages) if ages else timeout

    def unmatched_sources(self) -> list[str]:
        """The topics of this env's observations and step results that no publisher has matched yet.

        DDS matches a subscription to a publisher some time after both exist (seconds on a busy machine),
        and a message published before that reaches nobody: a reset answered then is lost.
        """
        sources = [*self._observed, *self._step_sources]
        if self._reward_source is not None:
            sources.append(self._reward_source)
        now = self._clock_s()
        seen: set[str] = set()
        unmatched = []
        for source in sources:
            if source.topic in seen:
                continue
            seen.add(source.topic)
            if source.subscription.get_publisher_count() == 0:
                source.matched_at = None
            elif source.matched_at is None:
                source.matched_at = now
            # The bridge's reader matches first; the robot's writer matches the reader a moment later (each
            # side handles the other's announcement on its own), and until then what it publishes is lost.
            if source.matched_at is None or now - source.matched_at < _MATCH_SETTLE_S:
                unmatched.append(source.topic)
        return unmatched

    def observe(self, now_ns: int, starting: bool = False) -> ObservationRow | None:
        """The current observation, or None if it is not fresh (:meth:`stale_sources` says why, whenever asked)
        or does not convert (:attr:`conversion_problem` says why, until one does).

        ``starting``: a chunk (or a policy request) would start from it. Then it is also None while an
        actuator has no subscriber: the chunk's steps would reach no robot while the trainer (or the
        recording) counted them. A step's outcome is observed whatever the actuators' state.
        """
        if starting and self._unheard():
            return None
        if self.stale_sources(now_ns):
            # Not recorded: a fresh message may come a moment later, before anything observes again
            # (right after every reset), and what /diagnostics says must not outlive the staleness.
            return None
        try:
            row = self._row()
        except ConversionError as exc:
            self.conversion_problem = str(exc)
            if isinstance(exc, ShortMessage):
                # the robot's message is valid, only shorter than the configured width: the env waits for one
                # that fits (a driver still starting up publishes empty arrays), warned at a throttle
                self._node.get_logger().warning(
                    f"env {self.index}: {exc}; the env idles until a message holds the configured width",
                    throttle_duration_sec=10.0,
                )
            else:
                self._node.get_logger().error(f"env {self.index}: {exc}", throttle_duration_sec=10.0)
            return None
        self._fresh_marks = None
        self.conversion_problem = ""
        if starting:
            self.moved = True
        return row

    def _unheard(self) -> bool:
        """True (and a warning once it lasts) while an actuator has no subscriber. DDS takes a moment to match
        a new publisher at every start; a robot still deaf after :data:`_UNHEARD_WARNING_S` is reported."""
        unheard = self.unheard_actuators()
        if not unheard:
            self._unheard_since_s = None
            return False
        now_s = self._clock_s()
        if self._unheard_since_s is None:
            self._unheard_since_s = now_s
        elif now_s - self._unheard_since_s > _UNHEARD_WARNING_S and now_s - self._unheard_warned_s > 10.0:
            self._unheard_warned_s = now_s  # by env: rclpy's throttle is per call site, and would hide env 1
            self._node.get_logger().warning(
                f"env {self.index}: no subscriber on {', '.join(unheard)}: no chunk starts until the robot "
                "subscribes, or its commands would be lost (control.wait_for_subscribers)"
            )
        return True

    def _row(self) -> ObservationRow:
        images = {}
        for name, source in self._images:
            try:
                image = source.latest.converted(source.config.converter)
            except ConversionError as exc:
                raise type(exc)(f"{source.config.key} ({source.topic}): {exc}") from None
            self._shapes.check(f"images.{name}", image)
            images[name] = image
        states = {}
        for name, parts in self._states:
            try:
                values = [p.latest.converted(p.config.converter) for p in parts]
            except ConversionError as exc:
                raise type(exc)(f"observations.states.{name}: {exc}") from None
            state = values[0] if len(values) == 1 else np.concatenate(values)
            self._shapes.check(f"states.{name}", state)
            states[name] = state
        text = self._text.latest.msg.data if self._text is not None else self._config.text.prompt
        return ObservationRow(images=images, states=states, text=text)

    def begin_window(self) -> None:
        """A chunk starts from the observation just captured: rewards and flags count from now."""
        self._reward_sum = 0.0
        for flag in self._flags:
            self._flags[flag] = False

    def take_step_result(self) -> tuple[float, bool, bool, bool]:
        """(reward, terminated, truncated, success) since the last call."""
        reward = self._reward_sum if self._config.reward.mode == "sum" else self._reward_latest
        self._reward_sum = 0.0
        flags = self._flags
        result = (float(reward), flags["terminated"], flags["truncated"], flags["success"])
        for flag in flags:
            flags[flag] = False
        return result

    def require_fresh(self) -> None:
        """From now on, observe only messages newer than this moment (a reset starts: the env has not moved)."""
        self._fresh_marks = [s.latest.seq for s in self._observed]
        self.moved = False

    def mark_step(self) -> None:
        """An action went out; its result is complete when every step source has spoken since."""
        self._step_marks = [s.latest.seq for s in self._step_sources]

    def step_complete(self) -> bool:
        marks = self._step_marks
        if marks is None:
            return not self._step_sources
        return all(s.latest.seq > mark for s, mark in zip(self._step_sources, marks))

    def step_waiting_for(self) -> list[str]:
        marks = self._step_marks or []
        return [s.topic for s, mark in zip(self._step_sources, marks) if s.latest.seq <= mark]

    # -- acting ------------------------------------------------------------

    def publish(self, action: np.ndarray, stamp: Any) -> dict[str, np.ndarray | None]:
        """Publish one step of ``action`` on every actuator (a non-finite slice idles that actuator).

        Returns what each actuator (by its config key) was sent after shaping, None where nothing was.
        """
        sent: dict[str, np.ndarray | None] = {}
        for config, publisher, shaper in self._actuators:
            values = shaper.shape(action)
            if values is None:
                self.nonfinite_actions += 1
                self._node.get_logger().error(
                    f"env {self.index}: {config.key} got non-finite values after scale/offset; idling it",
                    throttle_duration_sec=10.0,
                )
                sent[config.key] = self._idle_one(config, publisher, shaper, stamp)
                continue
            if publisher.publish(config.sink.build(values, stamp)) is False:
                sent[config.key] = None  # an action server's gate held this step back (rate, running goal)
                continue
            shaper.published(values)
            sent[config.key] = values
        self.mark_step()
        self.step_sent_s = self._clock_s()
        self.moved = True
        return sent

    def idle(self, stamp: Any) -> dict[str, np.ndarray | None]:
        """No valid step to take: every actuator does its configured idle behaviour.

        Not in lockstep: a simulator steps on every command it gets, so an idle
        command would be a step nobody counted. Returns what each actuator was
        sent (None: nothing), as :meth:`publish` does; empty in lockstep.
        """
        if self._lockstep:
            return {}
        return {
            config.key: self._idle_one(config, publisher, shaper, stamp)
            for config, publisher, shaper in self._actuators
        }

    def executed(self, base: np.ndarray, sent: dict[str, np.ndarray | None]) -> np.ndarray:
        """The action this step executed: ``base`` (the chunk's action) with each actuator's slice replaced by
        what it was sent (after its limits), mapped back into action units. An actuator sent nothing keeps its
        last command; NaN where it never had one."""
        action = np.array(base, dtype=np.float64)
        for config, _, shaper in self._actuators:
            values = sent.get(config.key)
            if values is None:
                values = shaper.last
            action[config.start : config.stop] = np.nan if values is None else shaper.unshape(values)
        return action

    def wait_delivered(self, deadline: float) -> bool:
        """Wait (until ``time.monotonic()`` reaches ``deadline``) for every actuator's subscribers to
        acknowledge what was published; False if one did not. A reliable publisher destroyed with a
        message still unacknowledged may never deliver it: the last idle command must arrive."""
        delivered = True
        for _, publisher, _ in self._actuators:
            left = max(0.0, deadline - time.monotonic())
            delivered = publisher.wait_for_all_acked(Duration(nanoseconds=int(left * 1e9))) and delivered
        return delivered

    @staticmethod
    def _idle_one(config: Any, publisher: Any, shaper: Any, stamp: Any) -> np.ndarray | None:
        if getattr(publisher, "holds_on_its_own", False) and shaper.idle == "hold":
            return None  # an action server keeps its last goal: sending it again would restart it
        values = shaper.idle_values()
        if values is not None:
            if publisher.publish(config.sink.build(values, stamp)) is False:
                return None
            shaper.published(values)
        return values
