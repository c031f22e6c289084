"""The vector env's robots: a fixed number of slots that the bridges' robots fill, stepped together.

A robot is an env index on a bridge connection. Its first infer gives it the
lowest free slot, and it keeps that slot until its connection closes. A
robot that finds every slot taken closes its whole connection for a resync
(a WARN, at most once a minute per host): the bridge reconnects with its
back-off, and gets in when a slot frees.

The websocket thread hands every checked event to :meth:`Slots.on_event`;
the trainer's thread calls :meth:`Slots.observe` (reset) and
:meth:`Slots.step`. A step answers the slots' waiting infers with their
actions (one chunk per infer, so a bridge's robots in one infer go together)
and returns when every slot has the feedback of that action: the reward and
the observation after the chunk. Where an episode ended, the autoreset mode
decides (Gymnasium's two rules):

* **next-step**: the step returns the episode's last observation; at the
  next step that slot's action is ignored and the first observation of its
  next episode is returned (reward 0). The bridge has such a robot sit out
  one exchange while its neighbours take their step (it is told by the
  metadata), so its first action comes with theirs after that.
* **same-step**: the step also waits for the next infer and returns the next
  episode's first observation, with the last one as ``final_obs``. The
  bridge asks for every robot of a connection at once (told by the metadata).

Where no episode ended, a step waits for the infer that follows the feedback
too: the observation the next action is for.

A slot whose bridge leaves while the trainer has its observation is
*lost*: its episode ends there (truncated, reward 0 if no feedback came), and
the step that needs its next observation waits for another robot to take
the slot, up to
``reconnect_timeout_s`` with a WARN every ``warn_every_s``, then raises
:class:`RobotsMissing` naming the slots. A robot that answers nothing for
``robot_timeout_s`` (no feedback, no next infer) stops the step the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from plugrl_ros.protocol.server_messages import EpisodeCount
from plugrl_ros.serve.chunks import ChunkMapping
from plugrl_ros.serve.events import Closed, Connected, Event, FedBack, Inferred, Observation
from plugrl_ros.serve.interventions import Intervened

log = logging.getLogger("plugrl_ros.vector")

_REFUSAL_QUIET_S = 60.0


class RobotsMissing(TimeoutError):
    """Slots without a robot, or robots that stopped answering, past their bound."""


@dataclass
class _Waiting:
    """An infer's row waiting for this slot's action."""

    event: Inferred
    observation: Observation
    read_at: float


@dataclass
class _Outcome:
    """A feedback's row: what the slot's last action did."""

    observation: Observation
    reward: float
    terminated: bool
    truncated: bool
    episode: EpisodeCount | None
    intervention: Intervened | None

    @property
    def ends(self) -> bool:
        return self.terminated or self.truncated


@dataclass
class _Slot:
    index: int
    link: int | None = None
    env: int | None = None
    waiting: _Waiting | None = None  # its infer, until the trainer's action answers it
    outcome: _Outcome | None = None  # the feedback of the running step
    lost: bool = False  # its robot left during its episode (until the step that reports it)
    shown: Observation | None = None  # the observation the trainer holds for it
    resetting: bool = False  # next-step: the trainer holds its episode's last observation; its reset step is next
    last: Observation | None = None  # its robot's latest observation (an infer may reuse it)
    wait_s: float = 0.0  # how long its robot waited for the running step's action
    remote: str = ""
    episode_start: float = 0.0  # when the trainer got the first observation of its episode


@dataclass(frozen=True)
class SlotResult:
    """One slot's part of a step."""

    observation: Observation  # the observation the next action is for
    reward: float
    terminated: bool
    truncated: bool
    final_observation: Observation | None  # where the episode ended: its last observation
    episode: EpisodeCount | None  # the bridge's count of the episode that ended
    intervention: Intervened | None  # a person's correction during the step
    lost: bool  # the robot left; another robot holds the slot now
    link: int
    env: int
    wait_s: float
    episode_s: float  # where an episode ended: how long it took, from its first observation to this step


@dataclass
class _Bridges:
    remote: dict[int, str] = field(default_factory=dict)  # open connection -> its peer
    slots: dict[int, dict[int, int]] = field(default_factory=dict)  # connection -> env index -> slot
    refused: dict[str, float] = field(default_factory=dict)  # peer's host -> when a refusal was last logged


class Slots:
    """``n`` robot slots filled by the bridges' robots (thread-safe: events come from the websocket thread)."""

    def __init__(
        self,
        n: int,
        chunks: ChunkMapping,
        close_link: Callable[[int], None],
        robot_timeout_s: float,
        reconnect_timeout_s: float,
        next_step: bool = True,
        health: Callable[[], BaseException | None] = lambda: None,
        warn_every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if n < 1:
            raise ValueError(f"num_envs: {n} must be at least 1 (robots stepped together)")
        self.chunks = chunks
        self._close_link = close_link
        self.robot_timeout_s = robot_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.next_step = next_step  # Gymnasium's next-step autoreset (else same-step)
        self.warn_every_s = warn_every_s
        self._clock = clock
        self._slots = [_Slot(i) for i in range(n)]
        self._bridges = _Bridges()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._health = health  # why the server stopped serving, if it did
        self.closing = False  # the vector env closes: its robots leave because it ends the run

    # -- the websocket thread ---------------------------------------------------------

    def on_event(self, event: Event) -> None:
        with self._changed:
            if isinstance(event, Connected):
                self._bridges.remote[event.link] = event.remote
                self._bridges.slots[event.link] = {}
            elif isinstance(event, Inferred):
                self._inferred(event)
            elif isinstance(event, FedBack):
                self._fed_back(event)
            elif isinstance(event, Closed):
                self._closed(event.link)
            self._changed.notify_all()

    def _inferred(self, event: Inferred) -> None:
        envs = self._bridges.slots.get(event.link)
        if envs is None:
            return  # a connection already refused
        new = [env for env in event.envs if env not in envs]
        free = [slot for slot in self._slots if slot.link is None]
        if len(new) > len(free):
            self._refuse(event.link, len(new), len(free))
            return
        for env, slot in zip(new, free):
            slot.link, slot.env, slot.remote = event.link, env, self._bridges.remote.get(event.link, "")
            envs[env] = slot.index
            log.info("slot %d: robot %d of bridge %d (%s)", slot.index, env, event.link, slot.remote)
        for env in event.envs:
            slot = self._slots[envs[env]]
            observation = event.rows[env] if env in event.rows else slot.last
            assert observation is not None, "a reused observation always follows a feedback on this connection"
            slot.last = observation
            slot.waiting = _Waiting(event, observation, event.received_s)

    def _refuse(self, link: int, robots: int, free: int) -> None:
        remote = self._bridges.remote.get(link, "?")
        host = remote.rpartition(":")[0] or remote  # a reconnection comes from another port
        now = self._clock()
        if now - self._bridges.refused.get(host, -_REFUSAL_QUIET_S) >= _REFUSAL_QUIET_S:
            self._bridges.refused[host] = now
            log.warning(
                "bridge %d (%s) brings %d more robot(s) but %d of the %d slots are free: its connection is closed; "
                "it reconnects and gets in when a slot frees (num_envs is the number of robots stepped together)",
                link,
                remote,
                robots,
                free,
                len(self._slots),
            )
        self._bridges.slots.pop(link, None)
        self._close_link(link)

    def _fed_back(self, event: FedBack) -> None:
        envs = self._bridges.slots.get(event.link, {})
        for row, env in enumerate(event.envs):
            slot = self._slots[envs[env]]
            slot.last = event.observations[row]
            slot.outcome = _Outcome(
                event.observations[row],
                float(event.rewards[row]),
                bool(event.terminated[row]),
                bool(event.truncated[row]),
                event.episodes[row],
                None if event.interventions is None else event.interventions[row],
            )

    def _closed(self, link: int) -> None:
        self._bridges.remote.pop(link, None)
        for slot_index in (self._bridges.slots.pop(link, None) or {}).values():
            slot = self._slots[slot_index]
            if slot.shown is not None and not slot.resetting and not self.closing:
                slot.lost = True  # the trainer holds an observation of this robot's episode, which ends here
                log.warning(
                    "slot %d: its robot (%s) left mid-episode; the episode is truncated and the slot waits for a robot",
                    slot.index,
                    slot.remote,
                )
            slot.link = slot.env = None
            slot.waiting = None
            slot.last = None

    # -- the trainer's thread ---------------------------------------------------------

    def observe(self, timeout_s: float) -> list[Observation]:
        """Every slot's observation, once each has a robot waiting for an action (reset)."""
        with self._changed:
            asked = "its robot has not asked for an action"
            self._wait(lambda slot: slot.waiting is not None, timeout_s, timeout_s, asked)
            now = self._clock()
            for slot in self._slots:
                assert slot.waiting is not None
                if slot.shown is None or slot.resetting:
                    slot.episode_start = now
                slot.shown = slot.waiting.observation
                slot.outcome = None
                slot.lost = False
                slot.resetting = False
            return [slot.shown for slot in self._slots if slot.shown is not None]

    def step(self, actions: np.ndarray) -> list[SlotResult]:
        """Answer the slots' infers with their rows of ``actions`` ``[n, H * action_dim]``; every slot's result."""
        if actions.shape[0] != len(self._slots):
            raise ValueError(f"actions for {actions.shape[0]} robots; this vector env steps {len(self._slots)}")
        with self._changed:
            self._answer(actions)
            self._wait(
                self._reported,
                self.robot_timeout_s,
                self.reconnect_timeout_s,
                "its robot sent no feedback or no next infer",
            )
            return [self._result(slot) for slot in self._slots]

    def _reported(self, slot: _Slot) -> bool:
        """Whether ``slot`` has all its result of the running step."""
        if slot.resetting:  # next-step: its reset step returns the next episode's first observation
            return slot.waiting is not None
        if slot.outcome is None and not slot.lost:
            return False
        if self.next_step and (slot.lost or (slot.outcome is not None and slot.outcome.ends)):
            return True  # its episode's last observation is the result; the next one comes at the next step
        return slot.waiting is not None

    def _answer(self, actions: np.ndarray) -> None:
        chunks = self.chunks.to_chunk(actions)  # [H, n, action_dim]
        infers: dict[int, tuple[Inferred, dict[int, np.ndarray]]] = {}
        now = self._clock()
        for slot in self._slots:
            waiting = slot.waiting
            if waiting is None or slot.resetting:
                continue  # its robot left after the last step (lost), or the action of a reset step: ignored
            infers.setdefault(id(waiting.event), (waiting.event, {}))[1][slot.env] = chunks[:, slot.index]  # type: ignore[index]
            slot.wait_s = now - waiting.read_at
            slot.waiting = None
        for event, by_env in infers.values():
            if set(by_env) != set(event.envs):
                slot_of = self._bridges.slots.get(event.link, {})
                raise RuntimeError(
                    f"bridge {event.link} asks for robots {list(event.envs)} together, while robot(s) "
                    f"{sorted(set(event.envs) - set(by_env))} (slot(s) {[slot_of.get(e) for e in event.envs]}) start "
                    "a new episode: next-step autoreset needs a bridge that has such robots sit out one exchange "
                    "(plugrl_ros's bridge does, told by the metadata); use same-step autoreset with this client"
                )
            event.answer.deliver(np.ascontiguousarray(np.stack([by_env[env] for env in event.envs], axis=1)))

    def _result(self, slot: _Slot) -> SlotResult:
        now = self._clock()
        if slot.resetting:
            assert slot.waiting is not None
            slot.resetting = False
            slot.episode_start = now
            return self._made(slot, slot.waiting.observation, 0.0, False, False, None, None, 0.0)
        outcome, lost = slot.outcome, slot.lost
        terminated = outcome is not None and outcome.terminated
        truncated = (outcome is not None and outcome.truncated) or (lost and not terminated)
        ended = terminated or truncated
        final = (outcome.observation if outcome is not None else slot.shown) if ended else None
        if self.next_step and ended:
            observation = final  # Gymnasium's next-step rule: the next episode's first observation comes next
            slot.resetting = True
        else:
            assert slot.waiting is not None
            observation = slot.waiting.observation
        episode_s = now - slot.episode_start
        if ended and not self.next_step:
            slot.episode_start = now
        result = self._made(
            slot,
            observation,
            outcome.reward if outcome is not None else 0.0,
            terminated,
            truncated,
            final,
            outcome,
            episode_s,
        )
        slot.outcome = None
        slot.lost = False
        return result

    def _made(
        self,
        slot: _Slot,
        observation: Observation | None,
        reward: float,
        terminated: bool,
        truncated: bool,
        final: Observation | None,
        outcome: _Outcome | None,
        episode_s: float,
    ) -> SlotResult:
        assert observation is not None
        slot.shown = observation
        ended = terminated or truncated
        return SlotResult(
            observation=observation,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_observation=final,
            episode=outcome.episode if outcome is not None and ended else None,
            intervention=outcome.intervention if outcome is not None else None,
            lost=slot.lost,
            link=slot.link if slot.link is not None else -1,
            env=slot.env if slot.env is not None else -1,
            wait_s=slot.wait_s,
            episode_s=episode_s,
        )

    def _wait(self, ready: Callable[[_Slot], bool], timeout_s: float, vacant_timeout_s: float, why: str) -> None:
        """Wait (holding the condition) until every slot is ``ready``: RobotsMissing past the bound.

        The bound is ``vacant_timeout_s`` while a slot has no robot, ``timeout_s`` otherwise.
        """
        start = warned = self._clock()
        while True:
            failure = self._health()
            if failure is not None:
                raise RuntimeError(f"the vector env's bridge server stopped: {failure!r}") from failure
            late = [slot for slot in self._slots if not ready(slot)]
            if not late:
                return
            now = self._clock()
            bound = vacant_timeout_s if any(slot.link is None for slot in late) else timeout_s
            if now - start >= bound:
                raise RobotsMissing(self._missing(late, now - start, why))
            if now - warned >= self.warn_every_s:
                warned = now
                log.warning("%s; waiting up to %g s", self._missing(late, now - start, why), bound)
            self._changed.wait(min(1.0, self.warn_every_s, max(0.0, start + bound - now)))

    def _missing(self, late: list[_Slot], waited: float, why: str) -> str:
        vacant = [slot.index for slot in late if slot.link is None]
        quiet = [f"{slot.index} ({slot.remote}, robot {slot.env})" for slot in late if slot.link is not None]
        parts = []
        if vacant:
            parts.append(f"slot(s) {', '.join(map(str, vacant))} have no robot")
        if quiet:
            parts.append(f"slot(s) {', '.join(quiet)}: {why}")
        bridges = len(self._bridges.remote)
        robots = sum(slot.link is not None for slot in self._slots)
        return (
            f"after {waited:.1f} s, {'; '.join(parts)} ({bridges} bridge(s) connected, "
            f"{robots} of {len(self._slots)} slots held)"
        )

    # -- what the env reports ----------------------------------------------------------

    def links(self) -> list[int]:
        """Each slot's bridge connection (-1: none)."""
        with self._lock:
            return [slot.link if slot.link is not None else -1 for slot in self._slots]
