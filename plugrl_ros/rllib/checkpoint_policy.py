"""An RLlib checkpoint's policy, acting without exploration: its RLModule between its own connector pipelines.

What a trained RLlib run leaves (``algo.save_to_path()``, ``algo.save()``,
Tune's checkpoints) holds the learner's RLModule and the env runner's
env-to-module and module-to-env pipelines with their state (a
``MeanStdFilter``'s running statistics, ...). :func:`load_checkpoint_policy`
loads those three with RLlib's own ``from_checkpoint`` and acts as the runner
does with ``explore=False``: the env-to-module pipeline on the observation,
``forward_inference``, the module-to-env pipeline (the distribution's
deterministic action, unsquashed or clipped into the action space)
(:class:`~plugrl_ros.rllib.inference.PolicyPass`, the runner's own code).

Deployed, the policy learns nothing: the connectors' state is the
checkpoint's for every observation (a filter's statistics do not drift with
what the robot sees, and the same observation always gets the same action).
Each observation is acted on alone, as the first of an episode: a policy
server is not told where a robot's episodes begin and end, so a stateful
RLModule (an LSTM) is refused, and connectors that read earlier observations
(frame stacking) see only the current one.

An RLlib checkpoint is pickled Python (RLlib writes its classes and
constructor arguments with cloudpickle): load only checkpoints you made.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_ros.serve.chunks import ChunkMapping

CHECKPOINT_INFO = "rllib_checkpoint.json"  # RLlib writes it at the top of every checkpoint
PART_INFO = "metadata.json"  # what RLlib writes into the folder of each part (module, learner, runner, ...)
ALGORITHM_STATE = "algorithm_state"
NEW_API_STACK_VERSION = 2  # checkpoint_version 2.x: RLModules, Learners, EnvRunners and connectors (Checkpointable)
# where the parts are, below an Algorithm checkpoint (RLlib 2.60's layout; new API stack)
_MODULE_DIRS = (("learner_group", "learner", "rl_module"), ("env_runner", "rl_module"))
_CONNECTOR_DIRS = (("env_runner",), ())


class CheckpointError(ValueError):
    """The path is not an RLlib checkpoint this server can act from; the message says why and what is expected."""


@dataclass(frozen=True)
class CheckpointParts:
    """Where an Algorithm checkpoint keeps the RLModule and the two connector pipelines."""

    root: Path
    module: Path
    env_to_module: Path
    module_to_env: Path


def checkpoint_parts(path: str | Path, module_id: str = "default_policy") -> CheckpointParts:
    """The parts of the Algorithm checkpoint at ``path``; CheckpointError naming what is missing."""
    root = Path(path).absolute()  # RLlib reads a relative path as a URI without a scheme (pyarrow refuses it)
    expected = "an RLlib Algorithm checkpoint (the folder algo.save_to_path() or algo.save() writes)"
    if not root.is_dir():
        raise CheckpointError(f"{root}: no such folder; expected {expected}")
    info_file = root / CHECKPOINT_INFO
    if not info_file.is_file() and (root / PART_INFO).is_file():
        raise CheckpointError(
            f"{root}: an RLlib checkpoint of a part (it has a {PART_INFO}, no {CHECKPOINT_INFO}), not of an "
            f"Algorithm; give the folder above it that holds {CHECKPOINT_INFO}"
        )
    if not info_file.is_file():
        raise CheckpointError(f"{root}: not an RLlib checkpoint (it has no {CHECKPOINT_INFO}); expected {expected}")
    try:
        info = json.loads(info_file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{info_file}: cannot be read as RLlib's checkpoint info: {exc}") from None
    # RLlib names an Algorithm's own state file "algorithm_state"; a module's, runner's, ... is another
    state_file = info.get("state_file") if isinstance(info, dict) else None
    if state_file != ALGORITHM_STATE:
        raise CheckpointError(
            f"{root}: an RLlib checkpoint of a part (its state file is {state_file!r}), not of an Algorithm; "
            f"expected {expected}"
        )
    version = str(info.get("checkpoint_version", ""))
    major = version.partition(".")[0]
    if not major.isdigit() or int(major) < NEW_API_STACK_VERSION:
        raise CheckpointError(
            f"{root}: an RLlib checkpoint of version {version or 'unknown'}, from RLlib's old API stack; "
            f"the server reads checkpoints of version {NEW_API_STACK_VERSION}.x and later (RLlib's new API stack)"
        )
    module = _first_dir(root, [(*parent, module_id) for parent in _MODULE_DIRS])
    if module is None:
        modules = sorted(p.name for parent in _MODULE_DIRS for p in root.joinpath(*parent).glob("*") if p.is_dir())
        raise CheckpointError(
            f"{root}: holds no RLModule {module_id!r} (RLlib's new API stack keeps it under "
            f"learner_group/learner/rl_module/); modules found: {modules or 'none'}"
        )
    env_to_module = _first_dir(root, [(*parent, "env_to_module_connector") for parent in _CONNECTOR_DIRS])
    module_to_env = _first_dir(root, [(*parent, "module_to_env_connector") for parent in _CONNECTOR_DIRS])
    if env_to_module is None or module_to_env is None:
        raise CheckpointError(
            f"{root}: holds no env-to-module and module-to-env connector pipelines (env_runner/*_connector): "
            "was it saved by an online algorithm of RLlib's new API stack?"
        )
    return CheckpointParts(root, module, env_to_module, module_to_env)


def _first_dir(root: Path, candidates: list[tuple[str, ...]]) -> Path | None:
    for parts in candidates:
        path = root.joinpath(*parts)
        if path.is_dir():
            return path
    return None


class CheckpointPolicy:
    """The checkpoint's RLModule and connectors; :meth:`act` maps one observation to one chunk ``[H, action_dim]``."""

    def __init__(self, parts: CheckpointParts, module: Any, env_to_module: Any, module_to_env: Any) -> None:
        from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

        from plugrl_ros.rllib.inference import PolicyPass

        self.parts = parts
        self.module = module
        self.env_to_module = env_to_module
        self.module_to_env = module_to_env
        observation_space = env_to_module.input_observation_space
        action_space = module_to_env.input_action_space
        if observation_space is None or action_space is None:
            raise CheckpointError(f"{parts.root}: its connector pipelines do not say the env's spaces")
        self.observation_space: gym.spaces.Space = observation_space
        self.action_space: gym.spaces.Space = action_space
        if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
            raise CheckpointError(
                f"{parts.root}: its action space is {action_space}; a robot's is a flat Box [horizon * action_dim] "
                "(robot_spaces(...).action_space)"
            )
        # the connectors' state as saved: every observation is processed with it (nothing learned while deployed)
        self._env_to_module_state = env_to_module.get_state()
        self._module_to_env_state = module_to_env.get_state()
        self._pass = PolicyPass(module, env_to_module, module_to_env, action_space, MetricsLogger())

    def act(self, observation: dict[str, dict[str, np.ndarray]], chunks: ChunkMapping) -> np.ndarray:
        """The chunk ``[H, action_dim]`` (float32) for one observation of :attr:`observation_space`."""
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode

        episode = SingleAgentEpisode(observation_space=self.observation_space, action_space=self.action_space)
        episode.add_env_reset(observation)
        self.env_to_module.set_state(self._env_to_module_state)
        self.module_to_env.set_state(self._module_to_env_state)
        prepared = self._pass.prepare([episode], explore=False)
        (decision,) = self._pass.decide(prepared, explore=False, t=0, random_actions=False)
        flat = np.asarray(decision.action_for_env, dtype=np.float32).reshape(1, -1)
        return chunks.to_chunk(flat)[:, 0, :]


def load_checkpoint_policy(path: str | Path, module_id: str = "default_policy") -> CheckpointPolicy:
    """Load the RLModule and connectors of the Algorithm checkpoint at ``path`` (CheckpointError if it is not one)."""
    parts = checkpoint_parts(path, module_id)  # before Ray is imported: a wrong path is refused at once
    from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2
    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(parts.module)
    if module.is_stateful():
        raise CheckpointError(
            f"{parts.root}: its RLModule is stateful (a recurrent model): a policy server is not told where a "
            "robot's episodes begin, so it cannot carry the model's state between requests"
        )
    module.eval()
    env_to_module = ConnectorPipelineV2.from_checkpoint(parts.env_to_module)
    module_to_env = ConnectorPipelineV2.from_checkpoint(parts.module_to_env)
    return CheckpointPolicy(parts, module, env_to_module, module_to_env)
