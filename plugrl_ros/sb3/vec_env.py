"""``RobotVecEnv``: the robots as a Stable-Baselines3 ``VecEnv``, on the Gymnasium vector env.

``SAC("MultiInputPolicy", RobotVecEnv.from_params("robot.yaml", num_envs=2))``
trains the robots behind the bridges with nothing else changed: SB3's own
vector API (``step_async``/``step_wait``, a list of infos) over
:class:`~plugrl_ros.vector.RobotVectorEnv`, whose same-step autoreset is
SB3's own rule: a robot whose episode ended gives the first observation of
its next one, with the last in ``infos[i]["terminal_observation"]`` and
``"TimeLimit.truncated"`` where the episode was cut rather than ended.
``infos[i]["episode"]`` (``r``, ``l``, ``t``) is the bridge's count of an
ended episode, in the form SB3's ``Monitor`` writes, so SB3's logger
(``rollout/ep_rew_mean``), its callbacks and ``evaluate_policy`` read the
robots' episodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices, VecEnvObs, VecEnvStepReturn

from plugrl_ros.vector import RobotVectorEnv, VectorSettings
from plugrl_ros.vector.env import ObservationForm


class RobotVecEnv(VecEnv):
    """The robots behind the bridges as an SB3 ``VecEnv`` (one env per robot)."""

    def __init__(self, env: RobotVectorEnv) -> None:
        if env.autoreset_mode is not AutoresetMode.SAME_STEP:
            raise ValueError("SB3's VecEnv resets on the same step: build the RobotVectorEnv with SAME_STEP")
        self.env = env
        super().__init__(env.num_envs, env.single_observation_space, env.single_action_space)
        self._actions: np.ndarray | None = None

    @classmethod
    def from_params(
        cls,
        params_file: str | Path,
        num_envs: int,
        settings: VectorSettings | None = None,
        observation: ObservationForm = "dict",
        **space_options: Any,
    ) -> RobotVecEnv:
        """From the bridge's own params file, as :meth:`RobotVectorEnv.from_params`."""
        vector = RobotVectorEnv.from_params(
            params_file, num_envs, settings, observation, AutoresetMode.SAME_STEP, **space_options
        )
        return cls(vector)

    @property
    def port(self) -> int:
        return self.env.port

    def reset(self) -> VecEnvObs:
        seed = next((s for s in self._seeds if s is not None), None)
        observations, _ = self.env.reset(seed=seed)
        self._reset_seeds()
        self._reset_options()
        return observations

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self) -> VecEnvStepReturn:
        assert self._actions is not None, "step_wait() without step_async()"
        observations, rewards, terminated, truncated, infos = self.env.step(self._actions)
        self._actions = None
        dones = terminated | truncated
        return observations, rewards.astype(np.float32), dones, self._per_env(infos, terminated, truncated)

    def _per_env(self, infos: dict[str, Any], terminated: np.ndarray, truncated: np.ndarray) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i in range(self.num_envs):
            info: dict[str, Any] = {"bridge": int(infos["bridge"][i]), "robot": int(infos["robot"][i])}
            info["wait_s"] = float(infos["wait_s"][i])
            if terminated[i] or truncated[i]:
                info["terminal_observation"] = infos["final_obs"][i]
                info["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            if "_robot_episode" in infos and infos["_robot_episode"][i]:
                episode = infos["robot_episode"]
                info["episode"] = {"r": float(episode["r"][i]), "l": int(episode["l"][i]), "t": float(episode["t"][i])}
                info["is_success"] = bool(episode["success"][i])
            if "_intervention_action" in infos and infos["_intervention_action"][i]:
                info["intervention_action"] = infos["intervention_action"][i]
            if "_lost" in infos and infos["lost"][i]:
                info["lost"] = True
            out.append(info)
        return out

    def close(self) -> None:
        self.env.close()

    # -- the rest of SB3's VecEnv: the robots have no attributes or methods to reach -----------------

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        if attr_name == "render_mode":
            return [None for _ in self._get_indices(indices)]
        raise AttributeError(f"the robots' envs have no attribute {attr_name!r} to read")

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        raise AttributeError(f"the robots' envs have no attribute {attr_name!r} to set")

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        raise AttributeError(f"the robots' envs have no method {method_name!r} to call")

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        # every robot's ended episode is reported as SB3's Monitor reports it (info["episode"]): evaluate_policy
        # reads those counts, as it does for a Monitor-wrapped env
        return [wrapper_class is Monitor for _ in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None for _ in range(self.num_envs)]
