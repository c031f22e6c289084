"""``RobotVectorEnv``: the robots behind one or more bridges as one Gymnasium vector env, serving PlugRL.

Any trainer that speaks Gymnasium's vector API (CleanRL's scripts, TorchRL,
skrl, Tianshou; Stable-Baselines3 through :mod:`plugrl_ros.sb3`) trains the
robots with it: the bridges connect to it as their PlugRL trainer, and each
robot is one sub-env (:mod:`plugrl_ros.vector.slots`). ``reset()`` waits
until every slot has a robot asking for an action; ``step(actions)`` answers
them and returns when each has reported the step and asked again.

Autoreset follows either of Gymnasium's rules (``metadata["autoreset_mode"]``):
**next-step**, Gymnasium's default and the one its vector wrappers
(``NormalizeObservation``, ``RecordEpisodeStatistics``, every observation
wrapper) are written for: the step where a robot's episode ends returns its
last observation, and the next step ignores that robot's action and returns
the first observation of its next episode (reward 0); or **same-step**
(Stable-Baselines3's rule, and CleanRL's scripts written for Gymnasium 0.29):
the step returns the next episode's first observation at once, with the last
one in ``infos["final_obs"]``. Either way the bridge is told the rule and
keeps to it, so every step is exactly what the robots did. Episodes start
and end on the robots (the bridge resets them); ``reset()`` after the first
returns the observations the robots wait with, it does not restart their
episodes.

What ``infos`` holds, per sub-env (Gymnasium's dict of arrays, with a
``_key`` mask where a key is not every sub-env's):

* ``bridge``, ``robot``: the connection number and the robot's env index on it;
* ``wait_s``: how long the robot waited for this step's action (its idle time);
* ``final_obs``, ``final_info`` where an episode ended (same-step only);
* ``robot_episode`` (``r``, ``l``, ``t``, ``success``) where an episode ended,
  as the bridge counted it (``RecordEpisodeStatistics``'s format under a key
  of its own, so that wrapper still adds its ``episode``);
* ``intervention`` (bool) and ``intervention_action`` (the chunk the robot
  executed, flat like the action) where a person corrected the step;
* ``lost``: the robot left during the step (its episode truncated, another
  robot holds the slot now).

Observations are ``{"states": {...}, "images": {...}}`` as the params file
maps them (``observation="nested"``), one level of names (``"dict"``, for
Stable-Baselines3's ``MultiInputPolicy``; the default), or the states
concatenated in name order into one ``Box`` (``"box"``, for scripts written
for one flat vector, such as CleanRL's).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from plugrl_ros import __version__
from plugrl_ros.protocol.messages import REUSE_FEEDBACK_OBS, VECTOR_AUTORESET
from plugrl_ros.protocol.server_auth import ServerAccess
from plugrl_ros.serve.bridge_server import BridgeServer
from plugrl_ros.serve.events import Observation
from plugrl_ros.serve.link_figures import Figures, LinkFigures
from plugrl_ros.serve.observations import ObservationReader
from plugrl_ros.serve.spaces import RobotSpaces, robot_spaces
from plugrl_ros.vector.slots import SlotResult, Slots

log = logging.getLogger("plugrl_ros.vector")

SERVER_NAME = "plugrl-ros-vector"
_AUTORESET_NAMES = {AutoresetMode.NEXT_STEP: "next-step", AutoresetMode.SAME_STEP: "same-step"}
ObservationForm = Literal["nested", "dict", "box"]


@dataclass(frozen=True)
class VectorSettings:
    """Where the vector env listens and how long it waits for robots."""

    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (``RobotVectorEnv.port`` tells which)
    access: ServerAccess = field(default_factory=ServerAccess)  # the API key's variable and TLS
    connect_timeout_s: float = 120.0  # reset(): every slot has a robot by then
    robot_timeout_s: float = 60.0  # step(): every robot has reported by then
    reconnect_timeout_s: float = 120.0  # step(): a slot whose robot left has another by then
    feedback_timeout_s: float = 60.0  # a bridge whose feedback is later is closed (the protocol's bound)
    algorithm: str = "Gymnasium trainer"  # what the bridges are told trains them

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "robot_timeout_s", "reconnect_timeout_s", "feedback_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{name}: {value!r} must be a number of seconds above 0")
        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            raise ValueError(f"port: {self.port!r} must be an integer in [0, 65535]")


class RobotVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` robots, over any number of bridges, as one Gymnasium vector env."""

    def __init__(
        self,
        spaces: RobotSpaces,
        num_envs: int,
        settings: VectorSettings | None = None,
        observation: ObservationForm = "dict",
        autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
    ) -> None:
        if autoreset_mode not in _AUTORESET_NAMES:
            raise ValueError(f"autoreset_mode: {autoreset_mode!r} must be AutoresetMode.NEXT_STEP or SAME_STEP")
        self.autoreset_mode = autoreset_mode
        self.metadata = {"autoreset_mode": autoreset_mode}
        self.settings = settings or VectorSettings()
        self.spaces = spaces
        self.chunks = spaces.chunks
        self.num_envs = num_envs
        self._form = _ObservationForm(spaces.observation_space, observation)
        self.single_observation_space = self._form.space
        self.single_action_space = spaces.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.figures = LinkFigures()
        self._server = BridgeServer(
            self.settings.host,
            self.settings.port,
            ObservationReader(spaces.observation_space),
            self._bridge_metadata(),
            self._on_event,
            self.figures,
            self.settings.feedback_timeout_s,
            access=self.settings.access,
            thread_name="plugrl-vector-link",
        )
        self._slots = Slots(
            num_envs,
            self.chunks,
            self._server.close_link,
            self.settings.robot_timeout_s,
            self.settings.reconnect_timeout_s,
            next_step=autoreset_mode is AutoresetMode.NEXT_STEP,
            health=self._server_failure,
        )
        self.port = self._server.listen()
        self._closed = False
        log.info(
            "PlugRL vector env: %d robot(s) of %s, listening for bridges on %s:%d",
            num_envs,
            self.settings.algorithm,
            self.settings.host,
            self.port,
        )

    @classmethod
    def from_params(
        cls,
        params_file: str | Path,
        num_envs: int,
        settings: VectorSettings | None = None,
        observation: ObservationForm = "dict",
        autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
        **space_options: Any,
    ) -> RobotVectorEnv:
        """From the bridge's own params file; ``space_options`` go to :func:`robot_spaces` (``horizon``, ...)."""
        return cls(robot_spaces(params_file, **space_options), num_envs, settings, observation, autoreset_mode)

    def _bridge_metadata(self) -> dict[str, Any]:
        return {
            "protocol_version": 1,
            "server": SERVER_NAME,
            "server_version": __version__,
            "algorithm": self.settings.algorithm,
            "policy": "trainer",
            "action_horizon": self.chunks.horizon,
            "action_dim": self.chunks.action_dim,
            "features": [REUSE_FEEDBACK_OBS],
            # every robot is stepped together, by this autoreset rule: the bridge asks for its robots accordingly
            VECTOR_AUTORESET: _AUTORESET_NAMES[self.autoreset_mode],
        }

    def _on_event(self, event: Any) -> None:
        self._slots.on_event(event)

    def _server_failure(self) -> BaseException | None:
        if self._server.listening:
            return None
        return self._server.failure or RuntimeError("the bridge server is not serving")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the vector env is closed")

    # -- Gymnasium ------------------------------------------------------------------------

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Every robot's observation, once each slot has one waiting (``connect_timeout_s`` at most).

        ``seed`` seeds the action space's sampler; the robots' episodes are seeded on their side.
        """
        if seed is not None:
            self._np_random, _ = gym.utils.seeding.np_random(seed if isinstance(seed, int) else seed[0])
            self.action_space.seed(seed if isinstance(seed, int) else seed[0])
        self._check_open()
        rows = self._slots.observe(self.settings.connect_timeout_s)
        infos = {"bridge": np.array(self._slots.links()), "_bridge": np.ones(self.num_envs, bool)}
        return self._batch(rows), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self._check_open()
        actions = np.asarray(actions, dtype=np.float32).reshape(self.num_envs, -1)
        results = self._slots.step(actions)
        observations = self._batch([result.observation for result in results])
        rewards = np.array([result.reward for result in results], dtype=np.float64)
        terminated = np.array([result.terminated for result in results], dtype=bool)
        truncated = np.array([result.truncated for result in results], dtype=bool)
        return observations, rewards, terminated, truncated, self._infos(results)

    def close_extras(self, **kwargs: Any) -> None:
        if not self._closed:
            self._closed = True
            self._slots.closing = True
            self._server.stop()

    def link_figures(self) -> Figures:
        """The link's figures since the last call: robots connected, their idle share, the infer round trip."""
        return self.figures.take()

    # -- arrays -----------------------------------------------------------------------------

    def _batch(self, rows: Sequence[Observation]) -> Any:
        items = [self._form.convert(row) for row in rows]
        out = create_empty_array(self.single_observation_space, self.num_envs)
        return concatenate(self.single_observation_space, items, out)

    def _infos(self, results: list[SlotResult]) -> dict[str, Any]:
        n = self.num_envs
        every = np.ones(n, bool)
        infos: dict[str, Any] = {
            "bridge": np.array([r.link for r in results]),
            "_bridge": every,
            "robot": np.array([r.env for r in results]),
            "_robot": every,
            "wait_s": np.array([r.wait_s for r in results]),
            "_wait_s": every,
        }
        ended = np.array([r.final_observation is not None for r in results])
        if ended.any() and self.autoreset_mode is AutoresetMode.SAME_STEP:
            finals = [
                self._form.convert(r.final_observation) if r.final_observation is not None else None for r in results
            ]
            infos["final_obs"] = np.empty(n, dtype=object)
            for i, final in enumerate(finals):
                infos["final_obs"][i] = final
            infos["_final_obs"] = ended
            infos["final_info"] = {}
            infos["_final_info"] = ended
        counted = np.array([r.episode is not None for r in results])
        if counted.any():
            infos["robot_episode"] = {
                "r": np.array([r.episode.ret if r.episode else 0.0 for r in results]),
                "l": np.array([r.episode.length if r.episode else 0 for r in results]),
                "t": np.array([round(r.episode_s, 6) if r.episode else 0.0 for r in results]),
                "success": np.array([bool(r.episode and r.episode.success) for r in results]),
            }
            infos["_robot_episode"] = counted
        corrected = np.array([r.intervention is not None for r in results])
        if corrected.any():
            size = self.chunks.horizon * self.chunks.action_dim
            executed = np.full((n, size), np.nan)
            for i, r in enumerate(results):
                if r.intervention is not None:
                    executed[i] = r.intervention.action.reshape(-1)
            infos["intervention"] = corrected
            infos["_intervention"] = every
            infos["intervention_action"] = executed
            infos["_intervention_action"] = corrected
        lost = np.array([r.lost for r in results])
        if lost.any():
            infos["lost"] = lost
            infos["_lost"] = every
        return infos


class _ObservationForm:
    """The robots' ``{"states": ..., "images": ...}`` rows in the form the trainer asked for."""

    def __init__(self, space: gym.spaces.Dict, form: ObservationForm) -> None:
        self.form = form
        self.groups = {group: list(inner.spaces) for group, inner in space.spaces.items()}
        if form == "nested":
            self.space: gym.spaces.Space = space
        elif form == "dict":
            names = [name for names in self.groups.values() for name in names]
            clash = sorted({name for name in names if names.count(name) > 1})
            if clash:
                raise ValueError(f'observation="dict": {clash} name both a state and an image; rename one')
            self.space = gym.spaces.Dict(
                {name: box for inner in space.spaces.values() for name, box in inner.spaces.items()}
            )
        elif form == "box":
            if "images" in self.groups:
                raise ValueError(
                    f'observation="box" joins states into one vector; this file also maps images '
                    f'{self.groups["images"]}: use observation="dict" or leave the images out (images=[])'
                )
            boxes: Mapping[str, gym.spaces.Box] = space.spaces["states"].spaces
            self.names = sorted(boxes)
            low = np.concatenate([boxes[name].low for name in self.names])
            high = np.concatenate([boxes[name].high for name in self.names])
            self.space = gym.spaces.Box(low, high, dtype=np.float32)
        else:
            raise ValueError(f'observation: {form!r} must be "dict", "nested" or "box"')

    def convert(self, row: Observation) -> Any:
        if self.form == "nested":
            return row
        if self.form == "dict":
            return {name: array for group in row.values() for name, array in group.items()}
        return np.concatenate([row["states"][name] for name in self.names]).astype(np.float32, copy=False)
