"""``PlugRLEnvRunner``: an RLlib EnvRunner (new API stack) that is a PlugRL trainer endpoint for bridges.

RLlib's algorithms call ``sample()``, ``get_state``/``set_state``,
``get_metrics`` and ``stop()`` on their EnvRunners without knowing what is
behind them. Behind this one are robots: bridges connect to its websocket
(:mod:`plugrl_ros.serve.bridge_server`, runner i on ``port + i``), ask for actions
with infers and report chunks with feedback. Inference happens here, on the
server side and on the websocket's thread as each infer is read (no hand-over
between threads on a step), through RLlib's own connector pipelines and RLModule
(:mod:`plugrl_ros.rllib.inference`); feedback becomes ``SingleAgentEpisode``s
(:mod:`plugrl_ros.rllib.robot_episodes`) that ``sample()`` returns with
RLlib's cut and lookback semantics. A robot needs no torch, no RLlib and no
pickle: it speaks PlugRL.

Timing. By default the robots are answered only inside ``sample()``: once a
call has its steps it answers no new infer, waits for the actions in flight
to come back, and returns, so the robots wait (the bridge's idle behaviour
keeps them safe) while the learner updates, and every step of a batch comes
from the weights it is trained on. ``serve_during_updates`` keeps answering
through the learner's updates, with the weights the runner holds at the time.
``sample()`` returns after ``sample_wait_s`` at the latest, with whatever it
has (maybe nothing: no robot is connected), below RLlib's
``sample_timeout_s``, past which RLlib would drop it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import ray
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.callbacks.utils import make_callback
from ray.rllib.core import (
    COMPONENT_ENV_TO_MODULE_CONNECTOR,
    COMPONENT_MODULE_TO_ENV_CONNECTOR,
    COMPONENT_RL_MODULE,
    DEFAULT_MODULE_ID,
)
from ray.rllib.core.rl_module.rl_module import RLModule, RLModuleSpec
from ray.rllib.env import INPUT_ENV_SINGLE_SPACES, INPUT_ENV_SPACES
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils import force_list
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.framework import get_device
from ray.rllib.utils.metrics import (
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SAMPLE_TIMER,
    TIME_BETWEEN_SAMPLING,
    WEIGHTS_SEQ_NO,
)
from ray.rllib.utils.typing import EpisodeID, ResultDict, StateDict

from plugrl_ros import __version__
from plugrl_ros.protocol.messages import REUSE_FEEDBACK_OBS
from plugrl_ros.protocol.server_auth import AccessError
from plugrl_ros.rllib.episode_callbacks import EpisodeCallbacks
from plugrl_ros.rllib.inference import PolicyPass
from plugrl_ros.rllib.robot_episodes import RobotEpisodes, Step
from plugrl_ros.rllib.settings import RunnerSettings, check_against
from plugrl_ros.rllib.sites import node_site
from plugrl_ros.serve.bridge_server import BridgeServer
from plugrl_ros.serve.chunks import ChunkMapping
from plugrl_ros.serve.events import Closed, Connected, Event, FedBack, Inferred
from plugrl_ros.serve.link_figures import LinkFigures
from plugrl_ros.serve.observations import ObservationReader

log = logging.getLogger("plugrl_ros.rllib")

SERVER_NAME = "plugrl-ros-rllib"
METRICS_KEY = "plugrl"  # the runner's own figures, under this key of the env runners' results
_WAKE_S = 0.2  # a waiting sample() looks at stop() and the server this often
EPISODE_LOG_LENGTH = 100_000


class RunnerStopped(RuntimeError):
    """sample() on a runner whose run was ended by stop()."""


class ServerDied(RuntimeError):
    """sample() on a runner whose bridge server thread died (logged there with its traceback).

    Raised rather than sampling nothing for ever: RLlib then treats the runner
    as failed, restarts it (``restart_failed_env_runners``) or ends the run.
    """


@dataclass(frozen=True)
class RobotEpisode:
    """One robot episode that ended, as the bridge counted it (else as the runner did)."""

    ended_at: float  # time.monotonic()
    link: int  # the bridge's connection
    env: int
    ret: float
    control_steps: int  # 0 when the bridge did not say
    success: bool | None


class PlugRLEnvRunner(EnvRunner, Checkpointable):
    """An EnvRunner whose environments are robots behind PlugRL bridges, with server-side inference."""

    def __init__(self, *, config: AlgorithmConfig, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.worker_index = self.worker_index or 0
        self.settings = RunnerSettings.from_env_config(self.config.env_config)
        check_against(self.settings, self.config.sample_timeout_s)
        observation_space, action_space = self.config.observation_space, self.config.action_space
        if observation_space is None or action_space is None:
            raise ValueError(
                "PlugRLEnvRunner needs config.environment(observation_space=..., action_space=...): "
                "robot_spaces(<the bridge's params file>) builds both"
            )
        self.observation_space: gym.Space = observation_space
        self.action_space: gym.Space = action_space
        self.chunks = ChunkMapping.of(action_space, self.settings.horizon)
        self._reader = ObservationReader(observation_space)
        self._device = get_device(self.config, 0 if not self.worker_index else self.config.num_gpus_per_env_runner)
        self._callbacks = [cls() for cls in force_list(self.config.callbacks_class)]
        self._env_to_module = self.config.build_env_to_module_connector(
            spaces=self._input_spaces(), device=self._device
        )
        self.module: RLModule | None = None
        self.make_module()
        self._module_to_env = self.config.build_module_to_env_connector(spaces=self._input_spaces())
        self._policy = PolicyPass(
            self.module,
            self._env_to_module,
            self._module_to_env,
            action_space,
            self.metrics,
            normalize_actions=self.config.normalize_actions,
        )
        self._weights_seq_no = 0
        self._done_episodes_for_metrics: list[SingleAgentEpisode] = []
        self._ongoing_episodes_for_metrics: defaultdict[EpisodeID, list[SingleAgentEpisode]] = defaultdict(list)
        self._episode_callbacks = EpisodeCallbacks(self, self._callbacks, self._ongoing_episodes_for_metrics)
        self._time_after_sampling: float | None = None
        self.episodes_to_numpy = self.config.episodes_to_numpy

        # what the events build; guarded by _lock (the websocket thread handles them as they come)
        self._lock = threading.RLock()
        self._progress = threading.Condition(self._lock)
        self._links: dict[int, RobotEpisodes] = {}
        self._deferred: list[Inferred] = []  # infers read while not answering (on-policy timing)
        self._failed: set[int] = set()  # connections closed after a failure, until their Closed event
        self._answering = False
        self._target: Callable[[], bool] | None = None  # the running sample()'s: has it got what it asked?
        self._explore = bool(self.config.explore)
        self._random_actions = False
        self._steps = 0  # RL steps fed back since the last sample returned
        self._ended: list[SingleAgentEpisode] = []
        self._abandoned: list[SingleAgentEpisode] = []  # chunks of connections that closed
        # every robot episode that ended, for a progress display (thread-safe appends, bounded)
        self.episode_log: deque[RobotEpisode] = deque(maxlen=EPISODE_LOG_LENGTH)

        self.figures = LinkFigures()
        # The local runner of an algorithm with remote ones samples nothing: it listens only when it is
        # the sampler, as RLlib's own runner builds its env only then.
        self.serving = self.worker_index > 0 or self.config.num_env_runners == 0
        # RLlib's evaluation runners get the config with in_evaluation set (and num_env_runners the
        # evaluation's): they listen on ports of their own
        self.evaluation = bool(self.config.in_evaluation)
        self._server: BridgeServer | None = None
        self._stopped = threading.Event()
        self.port: int | None = None
        # the robots' site this runner serves (site_label set): its node's, never its index's
        self.site: str | None = None
        if self.serving:
            if self.settings.site_label is not None:
                self.site = node_site(self.settings.site_label)
            requested_port = self.settings.port_of(self.worker_index, self.evaluation)
            self._server = BridgeServer(
                self.settings.host,
                requested_port,
                self._reader,
                self.metadata(),
                self._on_event,
                self.figures,
                self.settings.feedback_timeout_s,
                access=self.settings.access,
                thread_name="plugrl-rllib-link",
            )
            try:
                self.port = self._server.listen()
            except AccessError as exc:
                raise AccessError(f'PlugRL {self._name}: env_config["plugrl"]["{exc.setting}"]', exc.detail) from exc
            except OSError as exc:
                setting = "evaluation_port" if self.evaluation else "port"
                rule = (
                    f'every site\'s runner listens on env_config["plugrl"]["{setting}"] on its node, one runner '
                    "per site node; choose a port nothing else holds"
                    if self.site is not None
                    else f'{self._name.split()[0]} i listens on env_config["plugrl"]["{setting}"] + i; choose a port '
                    "range nothing else holds"
                )
                raise OSError(
                    f"PlugRL {self._name} cannot listen on {self.settings.host}:{requested_port} "
                    f"({exc.strerror or exc}): {rule}"
                ) from exc
            log.info(
                "PlugRL %s%s listens for bridges on %s:%d",
                self._name,
                "" if self.site is None else f" (site {self.site})",
                self.settings.host,
                self.port,
            )
            if self.settings.serve_during_updates:
                interval = self.settings.switch_interval_s
                if interval is not None and interval < sys.getswitchinterval():
                    sys.setswitchinterval(interval)  # the robots' answers wait less behind the learner's Python
                self._answering = True

    @property
    def _name(self) -> str:
        return f"{'evaluation runner' if self.evaluation else 'runner'} {self.worker_index}"

    # -- what the bridges are told ---------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        """The metadata every bridge gets first: the chunk's shape and the reuse feature."""
        algorithm = self.config.algo_class.__name__ if self.config.algo_class is not None else "RLlib"
        return {
            "protocol_version": 1,
            "server": SERVER_NAME,
            "server_version": __version__,
            "algorithm": f"RLlib {ray.__version__} {algorithm}",
            "policy": type(self.module).__name__ if self.module is not None else "random",
            "action_horizon": self.chunks.horizon,
            "action_dim": self.chunks.action_dim,
            "features": [REUSE_FEEDBACK_OBS],
        }

    # -- EnvRunner ------------------------------------------------------------------------

    def assert_healthy(self) -> None:
        assert self.module is not None, "the RLModule was not built (does the algorithm define one?)"
        if self.serving:
            assert self._server is not None and self._server.listening, (
                f"runner {self.worker_index} is not listening for bridges"
            )

    def _check_server(self) -> None:
        server = self._server
        if server is not None and not server.listening and not self._stopped.is_set():
            raise ServerDied(
                f"runner {self.worker_index}'s bridge server stopped serving ({server.failure!r}; its traceback "
                "is in the log): no robot can reach this runner"
            )

    def make_module(self) -> None:
        try:
            spec: RLModuleSpec = self.config.get_rl_module_spec(spaces=self.get_spaces(), inference_only=True)
            self.module = spec.build()
            self.module.to(self._device)
            # torch's inference mode for good: forward_exploration/forward_inference switch a module in
            # training mode to eval() and back at every call (a walk over all its submodules, twice per step)
            self.module.eval()
        except NotImplementedError:
            # as RLlib's runner: an algorithm without an RLModule can still take random actions
            self.module = None

    def get_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        return {
            **self._input_spaces(),
            DEFAULT_MODULE_ID: (self._env_to_module.observation_space, self.action_space),
        }

    def _input_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        # no vector env here: the input spaces are those of one robot's RL step
        return {
            INPUT_ENV_SPACES: (self.observation_space, self.action_space),
            INPUT_ENV_SINGLE_SPACES: (self.observation_space, self.action_space),
        }

    def sample(
        self,
        *,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        explore: bool | None = None,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> list[SingleAgentEpisode]:
        """At least ``num_timesteps`` RL steps (or ``num_episodes`` episodes), or what came within ``sample_wait_s``.

        ``force_reset`` cannot reset robots from here: a bridge resets its
        robots itself, at every episode's end and on every new connection.
        """
        if self._stopped.is_set():
            raise RunnerStopped(f"runner {self.worker_index} was stopped: its run is over")
        if not self.serving:
            raise ValueError(
                f"runner {self.worker_index} serves no robots: with num_env_runners > 0 the remote runners do"
            )
        assert not (num_timesteps is not None and num_episodes is not None)
        # RLlib's metrics logger is not thread-safe: what this call logs, and the on_sample_end callbacks, hold
        # the lock that the websocket thread's handling holds (the wait inside releases it)
        with self._lock:
            self._check_server()
            if self._time_after_sampling is not None:
                self.metrics.log_value(TIME_BETWEEN_SAMPLING, time.perf_counter() - self._time_after_sampling)
            self.metrics.log_value(WEIGHTS_SEQ_NO, self._weights_seq_no, window=1)
            with self.metrics.log_time(SAMPLE_TIMER):
                explore = self.config.explore if explore is None else explore
                if num_timesteps is None and num_episodes is None:
                    if self.config.batch_mode == "truncate_episodes":
                        num_timesteps = self.config.get_rollout_fragment_length(self.worker_index) * max(
                            1, self.config.num_envs_per_env_runner
                        )
                    else:
                        num_episodes = max(1, self.config.num_envs_per_env_runner)
                samples = self._sample(num_timesteps, num_episodes, bool(explore), random_actions)
                make_callback(
                    "on_sample_end",
                    callbacks_objects=self._callbacks,
                    callbacks_functions=self.config.callbacks_on_sample_end,
                    kwargs={"env_runner": self, "metrics_logger": self.metrics, "samples": samples},
                )
            self._time_after_sampling = time.perf_counter()
            return samples

    def _sample(
        self, num_timesteps: int | None, num_episodes: int | None, explore: bool, random_actions: bool
    ) -> list[SingleAgentEpisode]:
        deadline = time.monotonic() + self.settings.sample_wait_s

        def enough() -> bool:
            if num_timesteps is not None:
                return self._steps >= num_timesteps
            return len(self._ended) >= (num_episodes or 0)

        serving_always = self.settings.serve_during_updates
        # called by sample() under the lock, which waiting on the condition hands to the websocket thread;
        # this call's settings hold for the answers given while it waits, between calls the config's
        self._explore, self._random_actions = explore, random_actions
        self._target = enough
        try:
            if not serving_always:
                self._answering = True
                self.figures.resume()
                deferred, self._deferred = self._deferred, []
                for event in deferred:
                    self._handle_safely(event)
            # the websocket thread handles what comes from here on, and wakes this one when it is enough
            while not self._sampled():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopped.is_set():
                    break
                self._progress.wait(min(remaining, _WAKE_S))
                self._check_server()
        finally:
            self._target = None
            self._explore, self._random_actions = bool(self.config.explore), False
            if not serving_always:
                # whatever happened, the robots are not answered until the next call
                self._answering = False
                self.figures.pause()
        return self._collect(cut=num_timesteps is not None)

    def _sampled(self) -> bool:
        """Whether the running ``sample()`` has what it waits for (under the lock, on either thread).

        With on-policy timing, reaching its steps also ends the answering: no
        new action goes out, and the call waits for the ones in flight to come
        back before the learner updates.
        """
        if self._target is None or not self._target():
            return False
        if self.settings.serve_during_updates:
            return True
        self._answering = False
        return not any(robots.holding for robots in self._links.values())

    # -- events -----------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        """Every checked event, handled on the websocket thread as it arrives; a sample() that has enough is woken."""
        with self._progress:
            self._handle_safely(event)
            if self._sampled():
                self._progress.notify_all()

    def _handle_safely(self, event: Event) -> None:
        """Handle one event; if that fails, only its connection goes (closed for a resync), never the runner."""
        if event.link in self._failed:  # what the connection sent before its close came through
            if isinstance(event, Closed):
                self._failed.discard(event.link)
            return
        try:
            self._handle(event)
        except Exception:  # a connector, the RLModule or this code failed on what one bridge sent
            log.exception(
                "runner %d: handling bridge %d's %s failed; closing that connection for a resync "
                "(its unfinished episodes are dropped)",
                self.worker_index,
                event.link,
                type(event).__name__,
            )
            self._drop_link(event.link)
            if not isinstance(event, Closed):
                self._failed.add(event.link)
                assert self._server is not None
                self._server.close_link(event.link)

    def _drop_link(self, link: int) -> None:
        """Forget a connection whose state may be half-updated: none of its episodes reach the learner."""
        robots = self._links.pop(link, None)
        if robots is not None:
            for episode_id in robots.episode_ids():
                self._ongoing_episodes_for_metrics.pop(episode_id, None)
        self._deferred = [e for e in self._deferred if e.link != link]

    def _handle(self, event: Event) -> None:
        if isinstance(event, Connected):
            self._links[event.link] = RobotEpisodes(
                event.link, self.observation_space, self.action_space, self.chunks, self._episode_callbacks
            )
        elif isinstance(event, Inferred):
            if self._answering:
                self._answer(event)
            else:
                self._deferred.append(event)
        elif isinstance(event, FedBack):
            robots = self._links[event.link]
            for env, episode in robots.feedback(event, self._policy, self._explore):
                self._ended.append(episode)
                self.episode_log.append(self._robot_episode(event.link, env, episode))
            self._steps += len(event.envs)
        else:
            assert isinstance(event, Closed)
            robots = self._links.pop(event.link)
            for episode_id in robots.episode_ids():  # they never end: their earlier chunks count nowhere
                self._ongoing_episodes_for_metrics.pop(episode_id, None)
            self._abandoned += robots.close()
            self._deferred = [e for e in self._deferred if e.link != event.link]

    def _robot_episode(self, link: int, env: int, episode: SingleAgentEpisode) -> RobotEpisode:
        counted = episode.get_infos(-1).get("episode")
        if counted is not None:  # the bridge's own count, in control steps
            return RobotEpisode(time.monotonic(), link, env, counted["r"], counted["l"], counted["s"])
        chunks = [episode, *self._ongoing_episodes_for_metrics.get(episode.id_, [])]
        ret = sum(chunk.get_return() for chunk in chunks)
        return RobotEpisode(time.monotonic(), link, env, ret, 0, None)

    def _answer(self, event: Inferred) -> None:
        runners = self.config.num_env_runners or 1
        # as RLlib's runner counts them for exploration schedules: roughly all runners' steps so far
        t = (self.num_env_steps_sampled_lifetime // runners + self._steps) * runners
        step = Step(self._explore, t, self._random_actions, self._weights_seq_no)
        started = time.perf_counter()
        chunk, restarts = self._links[event.link].infer(event, self._policy, step)
        self.figures.inference(len(event.envs), time.perf_counter() - started)
        event.answer.deliver(chunk)
        for restart in restarts:
            # the robot's episode goes on in a new RLlib episode: its steps so far count with the new one
            previous = restart.previous
            counted = self._ongoing_episodes_for_metrics.pop(previous.id_, [])
            if len(previous) > 0:
                self._abandoned.append(previous)
                counted.append(previous)
            if counted:
                self._ongoing_episodes_for_metrics[restart.successor_id] = counted

    def _collect(self, cut: bool) -> list[SingleAgentEpisode]:
        ended, self._ended = self._ended, []
        abandoned, self._abandoned = self._abandoned, []
        running = (
            [c for robots in self._links.values() for c in robots.cut(self.config.episode_lookback_horizon)]
            if cut
            else []
        )
        self._steps = 0
        for chunk in running:
            chunk.validate()
            self._ongoing_episodes_for_metrics[chunk.id_].append(chunk)
        self._done_episodes_for_metrics.extend(ended)
        samples = ended + running + abandoned
        if self.episodes_to_numpy:
            samples = [episode.to_numpy() for episode in samples]
        steps = sum(len(episode) for episode in samples)
        if steps:
            self._log_env_steps(metric=self._metrics_num_env_steps_sampled, num_steps=steps)
        # RLlib's own runner's metric names and windows, so results read the same whatever the runner. A
        # private method of another class with this runner as self: it uses only self.metrics and
        # self.config, which every EnvRunner has (checked against Ray 2.60, pinned in requirements/rllib.txt;
        # the runner tests read these metrics, so a Ray upgrade that changes them fails there).
        SingleAgentEnvRunner._increase_sampled_metrics(self, steps, len(ended))  # type: ignore[arg-type]
        return samples

    # -- metrics and state --------------------------------------------------------------------

    def get_metrics(self) -> ResultDict:
        with self._lock:
            for episode in self._done_episodes_for_metrics:
                length, ret, seconds = len(episode), episode.get_return(), episode.get_duration_s()
                # the chunks of this episode returned earlier belong to it too
                for chunk in self._ongoing_episodes_for_metrics.pop(episode.id_, []):
                    length += len(chunk)
                    ret += chunk.get_return()
                    seconds += chunk.get_duration_s()
                # RLlib's own episode metrics (names, windows), as _collect's sampled counts (see the note there)
                SingleAgentEnvRunner._log_episode_metrics(self, length, ret, seconds)  # type: ignore[arg-type]
                self._log_robot_episode(episode)
            self._done_episodes_for_metrics.clear()
            self._log_link_figures()
            return self.metrics.reduce()

    def _log_robot_episode(self, episode: SingleAgentEpisode) -> None:
        """The bridge's own count of the episode (control steps, success), when it sent one."""
        counted = episode.get_infos(-1).get("episode")
        if counted is None:
            return
        window = max(1, self.config.metrics_num_episodes_for_smoothing // (self.config.num_env_runners or 1))
        self.metrics.log_value((METRICS_KEY, "episode_control_steps_mean"), counted["l"], window=window)
        self.metrics.log_value((METRICS_KEY, "episode_success_mean"), float(counted["s"]), window=window)

    def _log_link_figures(self) -> None:
        figures = self.figures.take()
        self.metrics.log_value((METRICS_KEY, "bridges_connected"), figures.bridges, reduce="sum", window=1)
        self.metrics.log_value((METRICS_KEY, "robots_connected"), figures.robots, reduce="sum", window=1)
        for name, value in (
            ("infer_round_trip_ms", figures.round_trip_ms),
            ("robot_idle_share", figures.idle_share),
            ("robot_idle_share_between_samples", figures.paused_share),
            ("inference_ms_per_row", figures.inference_ms_per_row),
        ):
            if value is not None:
                self.metrics.log_value((METRICS_KEY, name), value, window=1)

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> StateDict:
        with self._lock:
            state: StateDict = {NUM_ENV_STEPS_SAMPLED_LIFETIME: self.num_env_steps_sampled_lifetime}
            if self._check_component(COMPONENT_RL_MODULE, components, not_components) and self.module is not None:
                state[COMPONENT_RL_MODULE] = self.module.get_state(
                    components=self._get_subcomponents(COMPONENT_RL_MODULE, components),
                    not_components=self._get_subcomponents(COMPONENT_RL_MODULE, not_components),
                    **kwargs,
                )
                state[WEIGHTS_SEQ_NO] = self._weights_seq_no
            if self._check_component(COMPONENT_ENV_TO_MODULE_CONNECTOR, components, not_components):
                state[COMPONENT_ENV_TO_MODULE_CONNECTOR] = self._env_to_module.get_state()
            if self._check_component(COMPONENT_MODULE_TO_ENV_CONNECTOR, components, not_components):
                state[COMPONENT_MODULE_TO_ENV_CONNECTOR] = self._module_to_env.get_state()
            return state

    def set_state(self, state: StateDict) -> None:
        with self._lock:  # serve_during_updates: never change the weights under an inference
            if COMPONENT_ENV_TO_MODULE_CONNECTOR in state:
                self._env_to_module.set_state(state[COMPONENT_ENV_TO_MODULE_CONNECTOR])
            if COMPONENT_MODULE_TO_ENV_CONNECTOR in state:
                self._module_to_env.set_state(state[COMPONENT_MODULE_TO_ENV_CONNECTOR])
            if COMPONENT_RL_MODULE in state and self.module is not None:
                # 0 or no number forces the update; otherwise only newer weights are taken
                seq_no = state.get(WEIGHTS_SEQ_NO, 0)
                if seq_no == 0 or self._weights_seq_no < seq_no:
                    module_state = state[COMPONENT_RL_MODULE]
                    if isinstance(module_state, ray.ObjectRef):
                        module_state = ray.get(module_state)
                    if isinstance(module_state, dict) and DEFAULT_MODULE_ID in module_state:
                        module_state = module_state[DEFAULT_MODULE_ID]
                    self.module.set_state(module_state)
                if seq_no > 0:
                    self._weights_seq_no = seq_no
            if NUM_ENV_STEPS_SAMPLED_LIFETIME in state:
                self.num_env_steps_sampled_lifetime = state[NUM_ENV_STEPS_SAMPLED_LIFETIME]

    def get_ctor_args_and_kwargs(self) -> tuple[tuple, dict[str, Any]]:
        return (), {"config": self.config}

    def get_checkpointable_components(self) -> list[tuple[str, Any]]:
        return [
            (COMPONENT_RL_MODULE, self.module),
            (COMPONENT_ENV_TO_MODULE_CONNECTOR, self._env_to_module),
            (COMPONENT_MODULE_TO_ENV_CONNECTOR, self._module_to_env),
        ]

    def stop(self) -> None:
        """End the run for every bridge (``plugrl-server-stop``) and stop listening."""
        self._stopped.set()
        if self._server is not None:
            self._server.stop()
