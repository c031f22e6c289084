"""One bridge connection's robots as RLlib ``SingleAgentEpisode``s: infers and feedback in, episodes out.

An env's episode starts at its first observation on the connection, and
after each episode's end at the next one: ``add_env_reset`` with the infer's
row. Each feedback row is one RL step, ``add_env_step`` with the action the
env held (as sampled, with its ``action_logp``, ``action_dist_inputs`` and the
weights' sequence number), the chunk's summed reward, the observation after
the chunk (the terminal one when the episode ended), the flags, and the
bridge's ``info["episode"]`` on the row that ended it. With a person in the loop the
action stored is the one executed, and every step's infos say whether it was
``intervened`` (:mod:`plugrl_ros.serve.interventions`). RLlib's
``on_episode_*`` callbacks are made at the same points as RLlib's own runner
makes them (:mod:`plugrl_ros.rllib.episode_callbacks`).

A continuing episode's next action is computed from the observation the
robot is in when it asks. Usually that is its last feedback's: the bridge
marks the row reused under ``reuse-feedback-obs`` (then it is the feedback's
by construction), or sends the feedback's row again. But a robot may have
moved on since its feedback (the bridge was paused with the feedback held, a
client sends a fresh capture): then the infer's row differs from the
feedback's, and acting on the feedback's would command the robot from a
state it has left. So an infer row that differs from the feedback's ends the
episode's current chunk as a connection close does (not terminated, not
truncated: RLlib bootstraps its value, and no transition is stored that did
not happen) and starts a new episode from the fresh row, which the policy
acts on. The metrics count the two as one episode, as the bridge does.
The same happens where a robot's episode switches between random actions
(``sample(random_actions=True)``, an off-policy algorithm's warm-up) and
the RLModule's: the steps of one RLlib episode always carry the same model
outputs, which RLlib's replay buffers need to join its chunks.

The protocol forgets every env of a connection when it closes, and so does
this: steps already fed back stay valid training data and are returned as
chunks that never continue (RLlib bootstraps a chunk that did not end); the
action in flight is dropped with its unfinished step.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from plugrl_ros.rllib.episode_callbacks import EpisodeCallbacks
from plugrl_ros.rllib.inference import Decision, PolicyPass, Prepared
from plugrl_ros.serve.chunks import ChunkMapping
from plugrl_ros.serve.events import FedBack, Inferred, Observation
from plugrl_ros.serve.interventions import INTERVENED, executed_action


@dataclass
class _Robot:
    episode: SingleAgentEpisode | None = None  # the running episode's current chunk; None between episodes
    prepared: Prepared | None = None  # the env-to-module batch that holds its last observation ...
    row: int = 0  # ... at this row
    held: Decision | None = None  # the action it is executing, until its feedback
    # its last feedback's observation as the bridge sent it (the episode's copy may be rewritten by connectors)
    fed_back: Observation | None = None
    # whether the running episode's actions (in every chunk returned so far) were random; None before its first
    random_actions: bool | None = None


@dataclass(frozen=True)
class Restart:
    """A continuing episode that a fresh observation ended: its last chunk, and the episode that follows it."""

    previous: SingleAgentEpisode  # not done: RLlib bootstraps it; returned only if it has steps
    successor_id: str


@dataclass(frozen=True)
class Step:
    """What a policy call needs besides the observations."""

    explore: bool
    t: int  # global env steps, for exploration schedules
    random_actions: bool
    weights_seq_no: int


class RobotEpisodes:
    """The episodes of one connection's envs."""

    def __init__(
        self,
        link: int,
        observation_space: gym.Space,
        action_space: gym.Space,
        chunks: ChunkMapping,
        callbacks: EpisodeCallbacks,
    ) -> None:
        self.link = link
        self.observation_space = observation_space
        self.action_space = action_space
        self.chunks = chunks
        self.callbacks = callbacks
        self._robots: dict[int, _Robot] = {}

    @property
    def holding(self) -> bool:
        """Whether any env executes an action whose feedback has not come."""
        return any(robot.held is not None for robot in self._robots.values())

    def infer(self, event: Inferred, policy: PolicyPass, step: Step) -> tuple[np.ndarray, list[Restart]]:
        """The action chunk ``[H, n, action_dim]`` for the infer's envs, in its order; the episodes it restarted."""
        robots = [self._robots.setdefault(env, _Robot()) for env in event.envs]
        starting: list[tuple[int, _Robot]] = []
        restarts = []
        for env, robot in zip(event.envs, robots):
            row = event.rows.get(env)  # None: reused, the feedback's by construction
            previous = robot.episode
            if previous is not None and row is not None and not _same(row, robot.fed_back):
                # the robot moved on since its feedback: never act on the old observation
                robot.episode = robot.prepared = None
            elif previous is not None and robot.random_actions not in (None, step.random_actions):
                # Random actions carry no model outputs (action_logp, action_dist_inputs): RLlib's replay buffers
                # refuse to join chunks of one episode that differ in them. The episode goes on in a new one
                # from the same observation, as after a fresh row: the random chunk is bootstrapped.
                row = row if row is not None else robot.fed_back
                robot.episode = robot.prepared = None
            if robot.episode is None:
                # the connection checked that a reused row only ever continues an episode
                assert row is not None
                robot.episode = SingleAgentEpisode(
                    observation_space=self.observation_space, action_space=self.action_space
                )
                robot.random_actions = None
                self.callbacks.created(robot.episode, env)
                robot.episode.add_env_reset(observation=row)
                starting.append((env, robot))
                if previous is not None:
                    restarts.append(Restart(previous, robot.episode.id_))
            robot.fed_back = None
        if starting:
            self._prepare([robot for _, robot in starting], policy, step.explore)
            for env, robot in starting:
                self.callbacks.started(_running(robot), env)
        batches: dict[int, tuple[Prepared, list[_Robot]]] = {}
        for robot in robots:
            assert robot.prepared is not None and robot.held is None, "an env asked twice for one observation"
            batches.setdefault(id(robot.prepared), (robot.prepared, []))[1].append(robot)
        for prepared, members in batches.values():
            decisions = policy.decide(prepared, step.explore, step.t, step.random_actions)
            for robot in members:
                decision = decisions[robot.row]
                extra = {**decision.extra_model_outputs, WEIGHTS_SEQ_NO: step.weights_seq_no}
                robot.held = Decision(decision.action, decision.action_for_env, extra)
                robot.prepared = None
                robot.random_actions = step.random_actions
        return self.chunks.to_chunk(np.stack([_held(robot).action_for_env for robot in robots])), restarts

    def feedback(self, event: FedBack, policy: PolicyPass, explore: bool) -> list[tuple[int, SingleAgentEpisode]]:
        """Add each row's RL step; the episodes it ended, with their envs."""
        stepped = []
        for row, env in enumerate(event.envs):
            robot = self._robots[env]
            # the connection checked that an env in a feedback holds an action
            assert robot.held is not None and robot.episode is not None
            count = event.episodes[row]
            # kept as RLlib keeps an env's info: plain values under the protocol's own keys
            infos: dict = {} if count is None else {"episode": {"r": count.ret, "l": count.length, "s": count.success}}
            action, extra = robot.held.action, robot.held.extra_model_outputs
            if event.interventions is not None:
                intervened = event.interventions[row]
                infos[INTERVENED] = intervened is not None  # on every step of a bridge with a person in the loop
                if intervened is not None:
                    # what ran, not what was sampled; and its probability under the policy that acted
                    action = executed_action(action, intervened, policy.to_module_action)
                    extra = policy.behaviour_logp(extra, action)
            robot.episode.add_env_step(
                observation=event.observations[row],
                action=action,
                reward=float(event.rewards[row]),
                infos=infos,
                terminated=bool(event.terminated[row]),
                truncated=bool(event.truncated[row]),
                extra_model_outputs=extra,
            )
            robot.held = None
            robot.fed_back = _copied(event.observations[row])
            stepped.append(robot)
        # the terminal observations too: a connector that rewrites observations must see every one
        self._prepare(stepped, policy, explore)
        ended = []
        for env, robot in zip(event.envs, stepped):
            episode = _running(robot)
            # RLlib's order: every step's callback, then the end's on the step that ended the episode
            self.callbacks.stepped(episode, env)
            if episode.is_done:
                self.callbacks.ended(episode, env)
                ended.append((env, episode))
                robot.episode = robot.prepared = robot.fed_back = None
        return ended

    def cut(self, lookback: int) -> list[SingleAgentEpisode]:
        """The running episodes' chunks since the last cut (those with steps); collection goes on in successors."""
        chunks = []
        for robot in self._robots.values():
            if robot.episode is not None and len(robot.episode) > 0:
                chunks.append(robot.episode)
                robot.episode = robot.episode.cut(len_lookback_buffer=lookback)
        return chunks

    def episode_ids(self) -> list[str]:
        """The ids of the episodes running on this connection."""
        return [robot.episode.id_ for robot in self._robots.values() if robot.episode is not None]

    def close(self) -> list[SingleAgentEpisode]:
        """The connection is gone: the running episodes' chunks with steps, which will never continue."""
        chunks = [r.episode for r in self._robots.values() if r.episode is not None and len(r.episode) > 0]
        self._robots.clear()
        return chunks

    @staticmethod
    def _prepare(robots: list[_Robot], policy: PolicyPass, explore: bool) -> None:
        episodes = [robot.episode for robot in robots]
        assert all(episode is not None for episode in episodes)
        prepared = policy.prepare(episodes, explore)  # type: ignore[arg-type]
        for row, robot in enumerate(robots):
            robot.prepared, robot.row = prepared, row


def _same(row: Observation, fed_back: Observation | None) -> bool:
    """Whether an infer's row is the feedback's observation again (the same arrays, bit for bit)."""
    if fed_back is None:
        return False
    return all(
        np.array_equal(array, fed_back[group][name]) for group, arrays in row.items() for name, array in arrays.items()
    )


def _copied(row: Observation) -> Observation:
    return {group: {name: array.copy() for name, array in arrays.items()} for group, arrays in row.items()}


def _running(robot: _Robot) -> SingleAgentEpisode:
    assert robot.episode is not None
    return robot.episode


def _held(robot: _Robot) -> Decision:
    assert robot.held is not None
    return robot.held
