"""``plugrl-policy-server --lerobot PRETRAINED_DIR --config robot.yaml``: a LeRobot policy served as openpi serves one.

The server, its contract and its command line are
:mod:`plugrl_ros.serve.policy_server`'s; this backend loads a LeRobot policy
checkpoint (the ``pretrained_model`` folder ``lerobot-train`` writes: ACT,
Diffusion Policy, ...) with LeRobot's own ``from_pretrained``, and its
pre- and post-processors (normalisation, batching, a VLA's tokenizer) with
LeRobot's ``make_pre_post_processors``, as LeRobot's own policy server does.

Each request is read by the bridge's own params file
(:class:`~plugrl_ros.serve.request_reader.RequestReader`) into the policy's
input features, named as ``plugrl-export --to lerobot`` names them:

* ``observation.state``: the file's states concatenated in name order;
* ``observation.images.<name>``: the file's image ``<name>``, uint8 ``[H, W, 3]``
  turned into float ``[3, H, W]`` in [0, 1], as LeRobot's datasets give them;
* ``task``: the request's text, where the file maps one (a language policy's).

The policy's action chunk, unnormalised, is the chunk: its first H steps
(``--horizon``, default the policy's ``n_action_steps``). At startup the file
is checked against the policy: every feature it reads must be mapped and sent,
the widths and image sizes the file fixes must be the policy's, and the sinks'
width per step must be the policy's action width.

A policy that stacks a history of observations (Diffusion Policy's
``n_obs_steps``) keeps one per connection, so per robot: the requests that
robot sent, which are the observations at its chunks' starts (one request per
chunk), not at every control step.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_ros.params.section import ConfigError
from plugrl_ros.serve.chunks import ChunkMapping
from plugrl_ros.serve.policy_server import EXIT_BAD_INPUT, SERVER_NAME, LoadedPolicy, load_and_serve, parse
from plugrl_ros.serve.request_reader import ConfigMismatch, RequestReader, states_vector_space
from plugrl_ros.serve.spaces import ParamsFiles, configured_names, robot_spaces

log = logging.getLogger("plugrl_ros.lerobot_policy.policy_server")

STATE = "observation.state"
IMAGES = "observation.images."
ACTION = "action"
# the policies that stack a history of observations from their own queues (LeRobot's populate_queues)
HISTORY = ("diffusion",)


class PolicyError(ValueError):
    """The folder is not a LeRobot policy this server can act from; the message says why."""


def load_policy(folder: str | Path) -> tuple[Any, Any, Any]:
    """The policy in ``folder`` on the CPU, in eval mode, with its pre- and post-processor (PolicyError if not)."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    path = Path(folder)
    if not (path / "config.json").is_file():
        raise PolicyError(
            f"{path}: no config.json; give a LeRobot policy's folder, e.g. lerobot-train's "
            "OUTPUT/checkpoints/last/pretrained_model"
        )
    try:
        config = PreTrainedConfig.from_pretrained(path)
        config.device = "cpu"
        policy = get_policy_class(config.type).from_pretrained(path, config=config)
        cpu = {"device_processor": {"device": "cpu"}}
        pre, post = make_pre_post_processors(
            policy.config, pretrained_path=str(path), preprocessor_overrides=cpu, postprocessor_overrides=cpu
        )
    except (OSError, ValueError, KeyError, RuntimeError, NotImplementedError) as exc:
        raise PolicyError(f"{path}: LeRobot could not load the policy or its processors: {exc}") from exc
    policy.eval()
    return policy, pre, post


def observation_space(features: Mapping[str, Any], params_file: ParamsFiles) -> gym.spaces.Dict:
    """The robot's ``{"states", "images"}`` space that gives the policy's input ``features`` (ConfigMismatch if
    the file cannot give one of them)."""
    states, images = configured_names(params_file)
    groups: dict[str, gym.spaces.Dict] = {}
    for key, feature in sorted(features.items()):
        shape = tuple(int(n) for n in feature.shape)
        if key == STATE:
            groups["states"] = states_vector_space(shape[0], params_file, states)["states"]
        elif key.startswith(IMAGES) and key[len(IMAGES) :] in images and len(shape) == 3:
            channels, height, width = shape
            box = gym.spaces.Box(0, 255, (height, width, channels), np.uint8)
            groups.setdefault("images", gym.spaces.Dict({})).spaces[key[len(IMAGES) :]] = box
        else:
            raise ConfigMismatch(
                f"the policy reads {key!r} {list(shape)}, which {params_file} does not give: the server sends "
                f"{STATE!r} (its states {states}, concatenated in name order) and '{IMAGES}<name>' for its images "
                f"{images}, as plugrl-export --to lerobot names them"
            )
    return gym.spaces.Dict(groups)


def chunk_length(config: Any) -> int:
    """How many steps one prediction of the policy holds (ACT: ``chunk_size``; else ``n_action_steps``)."""
    return int(getattr(config, "chunk_size", None) or config.n_action_steps)


def load(args: argparse.Namespace) -> LoadedPolicy:
    """The policy ``args.lerobot`` as a served policy (PolicyError, ConfigMismatch or ConfigError if not servable)."""
    import lerobot
    import torch

    policy, pre, post = load_policy(args.lerobot)
    config = policy.config
    if ACTION not in config.output_features or len(config.output_features[ACTION].shape) != 1:
        raise PolicyError(f"{args.lerobot}: the policy has no flat {ACTION!r} output ({config.output_features})")
    action_dim = int(config.output_features[ACTION].shape[0])
    horizon = args.horizon or int(config.n_action_steps)
    if horizon > chunk_length(config):
        raise PolicyError(f"--horizon {horizon}: the policy predicts {chunk_length(config)} steps at a time")
    space = observation_space(config.input_features, args.config)
    chunk_space = ChunkMapping(horizon, action_dim).chunk_space(_step_space(args.config, space, action_dim))
    reader = RequestReader.from_params_file(args.config, space, chunk_space, horizon)
    states = list(space.spaces["states"].spaces) if "states" in space.spaces else []

    def features(request: Any) -> dict[str, Any]:
        row = reader.observation(request)
        batch: dict[str, Any] = {}
        if states:
            state = np.concatenate([row["states"][name] for name in states]).astype(np.float32)
            batch[STATE] = torch.from_numpy(state)[None]
        for name, image in row.get("images", {}).items():
            batch[IMAGES + name] = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].float() / 255
        task = reader.text(request)
        if task is not None:
            batch["task"] = task
        return batch

    def chunk(batch: dict[str, Any], history: dict | None) -> np.ndarray:
        with torch.inference_mode():
            batch = pre(batch)
            if history is not None:
                actions = _with_history(policy, history, batch)
            else:
                actions = policy.predict_action_chunk(batch)
            steps = actions.reshape(-1, action_dim)[:horizon]  # one robot: [steps, action_dim]
            return post(steps).cpu().numpy().astype(np.float32)

    def act(request: Any) -> np.ndarray:
        return chunk(features(request), None)

    connect = None
    if config.type in HISTORY:

        def connect() -> Callable[[Any], np.ndarray]:
            policy.reset()
            history = policy._queues  # this connection's own: reset() made new ones
            return lambda request: chunk(features(request), history)

    return LoadedPolicy(
        act=act,
        horizon=horizon,
        action_dim=action_dim,
        policy=f"LeRobot {lerobot.__version__} {config.type}",
        source=str(Path(args.lerobot)),
        connect=connect,
    )


def _step_space(params_file: ParamsFiles, space: gym.spaces.Dict, action_dim: int) -> gym.spaces.Box:
    """The sinks' action space per step, which must be ``action_dim`` wide (ConfigMismatch if not)."""
    states = space.spaces.get("states", gym.spaces.Dict({})).spaces
    images = space.spaces.get("images", gym.spaces.Dict({})).spaces
    try:
        return robot_spaces(
            params_file,
            states=list(states),
            images=list(images),
            state_dims={name: int(box.shape[0]) for name, box in states.items()},
            image_shapes={name: list(box.shape) for name, box in images.items()},
            action_dim=action_dim,
        ).step_action_space
    except (ConfigError, ValueError) as exc:
        raise ConfigMismatch(
            f"{params_file} does not describe the robot the policy was trained for: the policy's actions are "
            f"{action_dim} wide, it reads the states {sorted(states)} and the images {sorted(images)}; {exc}"
        ) from None


def _with_history(policy: Any, history: dict, batch: dict[str, Any]) -> Any:
    """Diffusion Policy's prediction from one connection's history (as its ``select_action`` stacks one)."""
    import torch
    from lerobot.policies.utils import populate_queues

    batch = {key: value for key, value in batch.items() if key != ACTION}  # the processors' empty action slot
    if policy.config.image_features:
        batch["observation.images"] = torch.stack([batch[key] for key in policy.config.image_features], dim=-4)
    policy._queues = populate_queues(history, batch)
    return policy.predict_action_chunk(batch)


def serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM, then 0; 2 for a policy or params file it cannot serve."""
    if args.lerobot is None:
        print(f"{SERVER_NAME}: this backend serves --lerobot PRETRAINED_DIR", file=sys.stderr)
        return EXIT_BAD_INPUT
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)  # one robot's observation at a time
    return load_and_serve(args, load, (PolicyError, ConfigMismatch, ConfigError))


def main(argv: Sequence[str] | None = None) -> int:
    return serve(parse(list(argv) if argv is not None else None))


if __name__ == "__main__":
    sys.exit(main())
