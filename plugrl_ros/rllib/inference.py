"""Actions from RLlib's own pipelines: env-to-module connectors, the RLModule, module-to-env connectors.

As in RLlib's ``SingleAgentEnvRunner``, the env-to-module pipeline runs once
on every observation, right after it enters its episode (a reset observation
from an infer, or a chunk's observation from a feedback, terminal ones
included), so connectors that rewrite an episode's last observation in place
(flattening, filters, frame stacking) see each observation exactly once, and
an episode chunk that is cut and returned holds processed observations only.
The pipeline's output for those episodes is kept as a :class:`Prepared` batch
until their envs ask for actions. Then the RLModule's ``forward_exploration``
(or ``forward_inference``) runs on it, and the module-to-env pipeline turns
its output into actions: sampled with their ``action_logp`` and
``action_dist_inputs``, and clipped or unsquashed into the action space for the
robot (``actions_for_env``), never by hand. Robots of one batch that ask at
different times are answered from separate passes over it; an answer not
asked for is dropped, never sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.metrics import ENV_TO_MODULE_CONNECTOR, MODULE_TO_ENV_CONNECTOR, RLMODULE_INFERENCE_TIMER
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
from ray.rllib.utils.spaces.space_utils import normalize_action, unbatch


@dataclass
class Prepared:
    """The env-to-module output for a list of episodes that just received an observation."""

    episodes: list[SingleAgentEpisode]
    to_module: Any  # None without an RLModule (random actions only)
    shared_data: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """One env's action: what the episode stores, what the robot gets, and the module's outputs with it."""

    action: Any  # as sampled (stored in the episode; the learner computes logp of this)
    action_for_env: np.ndarray  # clipped or unsquashed into the action space
    extra_model_outputs: dict[str, Any]  # action_logp, action_dist_inputs, ...


class PolicyPass:
    """The runner's connector pipelines and RLModule, applied to prepared batches."""

    def __init__(
        self,
        module: RLModule | None,
        env_to_module: ConnectorV2,
        module_to_env: ConnectorV2,
        action_space: gym.spaces.Space,
        metrics: MetricsLogger,
        normalize_actions: bool = False,
    ) -> None:
        """``normalize_actions``: the config's, which the module-to-env pipeline applies (it unsquashes)."""
        self.module = module
        self.env_to_module = env_to_module
        self.module_to_env = module_to_env
        self.action_space = action_space
        self.metrics = metrics
        self.normalize_actions = normalize_actions

    def to_module_action(self, action: np.ndarray) -> np.ndarray:
        """An action in the action space as the module's output would be: the inverse of the module-to-env
        pipeline's unsquashing (``normalize_actions``; clipping has no inverse: a clipped action is itself)."""
        if self.normalize_actions:
            return np.asarray(normalize_action(np.asarray(action, dtype=np.float32), self.action_space))
        return np.asarray(action)

    def behaviour_logp(self, extra: dict[str, Any], action: np.ndarray) -> dict[str, Any]:
        """``extra`` (a step's module outputs) with ``action_logp`` recomputed for ``action``, from the same
        ``action_dist_inputs``: the probability of what was executed under the policy that acted."""
        if self.module is None or Columns.ACTION_LOGP not in extra or Columns.ACTION_DIST_INPUTS not in extra:
            return extra
        import torch  # the runner's modules are torch modules; imported only where a step was intervened

        dist_inputs = torch.as_tensor(np.asarray(extra[Columns.ACTION_DIST_INPUTS], dtype=np.float32))[None]
        dist = self.module.get_exploration_action_dist_cls().from_logits(dist_inputs)
        logp = dist.logp(torch.as_tensor(np.asarray(action, dtype=np.float32))[None])[0]
        old = np.asarray(extra[Columns.ACTION_LOGP])
        return {**extra, Columns.ACTION_LOGP: logp.detach().numpy().astype(old.dtype).reshape(old.shape)}

    def prepare(self, episodes: list[SingleAgentEpisode], explore: bool) -> Prepared:
        """Run the env-to-module pipeline on episodes whose last observation is new (once per observation)."""
        prepared = Prepared(episodes, None)
        if self.module is not None and episodes:
            prepared.to_module = self.env_to_module(
                rl_module=self.module,
                batch={},
                episodes=episodes,
                explore=explore,
                shared_data=prepared.shared_data,
                metrics=self.metrics,
                metrics_prefix_key=(ENV_TO_MODULE_CONNECTOR,),
            )
        return prepared

    def decide(self, prepared: Prepared, explore: bool, t: int, random_actions: bool) -> list[Decision]:
        """One decision per episode of ``prepared``, in its order."""
        n = len(prepared.episodes)
        if random_actions or self.module is None:
            actions = [self.action_space.sample() for _ in range(n)]
            return [Decision(a, np.asarray(a), {}) for a in actions]
        with self.metrics.log_time(RLMODULE_INFERENCE_TIMER):
            if explore:
                to_env = self.module.forward_exploration(prepared.to_module, t=t)
            else:
                to_env = self.module.forward_inference(prepared.to_module)
        to_env = self.module_to_env(
            rl_module=self.module,
            batch=to_env,
            episodes=prepared.episodes,
            explore=explore,
            shared_data=prepared.shared_data,
            metrics=self.metrics,
            metrics_prefix_key=(MODULE_TO_ENV_CONNECTOR,),
        )
        actions = to_env.pop(Columns.ACTIONS)
        for_env = to_env.pop(Columns.ACTIONS_FOR_ENV, actions)
        actions, for_env = _rows(actions), _rows(for_env)
        return [
            Decision(actions[i], np.asarray(for_env[i]), {key: value[i] for key, value in to_env.items()})
            for i in range(n)
        ]


def _rows(batch: Any) -> list[Any]:
    """A batch's rows: an array's own rows (what RLlib's ``unbatch`` gives for one, without its tree walk at
    every step), else ``unbatch`` of the structure."""
    return list(batch) if isinstance(batch, np.ndarray) else unbatch(batch)
