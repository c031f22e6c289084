"""``plugrl-policy-server --sb3 MODEL.zip --config robot.yaml``: a Stable-Baselines3 model served as openpi serves one.

The server, its contract and its command line are
:mod:`plugrl_ros.serve.policy_server`'s; this backend loads a model that was
trained on :class:`~plugrl_ros.sb3.RobotVecEnv` (``model.save``'s zip) with
SB3's own ``load`` and acts with ``predict(..., deterministic=True)``. Each
request is read into the robot's observation by the bridge's own params file
(:class:`~plugrl_ros.serve.request_reader.RequestReader`), then into the
form the model was trained on (one level of names, or one flat vector), and
the model's action (the whole chunk, flat) is the chunk ``[H, action_dim]``.
At startup the file is checked against the model: every state and image the
model reads must be mapped and sent, with the widths the file fixes, and the
sinks' action width and limits must be the model's.

An SB3 model file holds pickled Python (SB3 writes its spaces and schedules
with cloudpickle, and reads them back): load only models you made.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_ros.params.section import ConfigError
from plugrl_ros.serve.policy_server import EXIT_BAD_INPUT, SERVER_NAME, LoadedPolicy, load_and_serve, parse
from plugrl_ros.serve.request_reader import ConfigMismatch, RequestReader, states_vector_space
from plugrl_ros.serve.spaces import ParamsFiles, configured_names

log = logging.getLogger("plugrl_ros.sb3.policy_server")

ALGORITHMS = ("PPO", "SAC", "TD3", "A2C", "DDPG")
# keys of the model file's data that only one algorithm writes (DDPG is TD3 with one critic update per step)
_SIGNATURES = (
    ("clip_range", "PPO"),
    ("target_entropy", "SAC"),
    ("target_policy_noise", "TD3"),
    ("rms_prop_eps", "A2C"),
)


class ModelError(ValueError):
    """The file is not a Stable-Baselines3 model this server can act from; the message says why."""


def algorithm_of(path: Path) -> str:
    """The algorithm that wrote the model at ``path``, from the names its data holds (read as JSON only)."""
    try:
        with zipfile.ZipFile(path) as archive:
            data = json.loads(archive.read("data"))
    except (OSError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: not a Stable-Baselines3 model file (model.save's .zip): {exc}") from None
    for key, name in _SIGNATURES:
        if key in data:
            return "DDPG" if name == "TD3" and data.get("policy_delay") == 1 else name
    raise ModelError(f"{path}: cannot tell which algorithm wrote it; pass --algorithm ({', '.join(ALGORITHMS)})")


def load_model(path: str | Path, algorithm: str | None) -> Any:
    """The model at ``path``, on the CPU (ModelError if it cannot be loaded)."""
    import stable_baselines3

    model_path = Path(path)
    if not model_path.is_file():
        raise ModelError(f"{model_path}: no such file (give the .zip that model.save wrote)")
    name = (algorithm or algorithm_of(model_path)).upper()
    if name not in ALGORITHMS:
        raise ModelError(f"--algorithm: {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    try:
        return getattr(stable_baselines3, name).load(model_path, device="cpu")
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ModelError(f"{model_path}: Stable-Baselines3's {name}.load failed: {exc}") from exc


def nested_space(model_space: gym.spaces.Space, params_file: ParamsFiles) -> tuple[gym.spaces.Dict, list[str] | None]:
    """The robot's ``{"states", "images"}`` space the model reads, and the states' order if it reads one vector.

    A ``Dict`` model space names states and images (RobotVecEnv's default form); a flat ``Box`` is the
    file's states, concatenated in name order (``observation="box"``).
    """
    states, images = configured_names(params_file)
    if isinstance(model_space, gym.spaces.Dict):
        groups: dict[str, dict[str, gym.spaces.Space]] = {"states": {}, "images": {}}
        for name, box in model_space.spaces.items():
            if name in states:
                groups["states"][name] = box
            elif name in images:
                groups["images"][name] = box
            else:
                raise ConfigMismatch(
                    f"the model reads {name!r}, which {params_file} maps as neither a state ({states}) "
                    f"nor an image ({images})"
                )
        return gym.spaces.Dict({g: gym.spaces.Dict(b) for g, b in groups.items() if b}), None
    if isinstance(model_space, gym.spaces.Box) and len(model_space.shape) == 1:
        return states_vector_space(model_space.shape[0], params_file, states), states
    raise ConfigMismatch(f"the model's observation space {model_space} is not one RobotVecEnv makes")


def load(args: argparse.Namespace) -> LoadedPolicy:
    """The model ``args.sb3`` as a served policy (ModelError, ConfigMismatch or ConfigError if not servable)."""
    import stable_baselines3

    model = load_model(args.sb3, args.algorithm)
    nested, box_order = nested_space(model.observation_space, args.config)
    reader = RequestReader.from_params_file(args.config, nested, model.action_space, args.horizon)

    def act(request: Any) -> np.ndarray:
        row = reader.observation(request)
        if box_order is not None:
            observation: Any = np.concatenate([row["states"][name] for name in box_order]).astype(np.float32)
        else:
            observation = {name: array for group in row.values() for name, array in group.items()}
        action, _ = model.predict(observation, deterministic=True)
        return reader.chunks.to_chunk(np.asarray(action, dtype=np.float32).reshape(1, -1))[:, 0, :]

    return LoadedPolicy(
        act=act,
        horizon=reader.chunks.horizon,
        action_dim=reader.chunks.action_dim,
        policy=f"Stable-Baselines3 {stable_baselines3.__version__} {type(model).__name__} (deterministic)",
        source=str(Path(args.sb3)),
    )


def serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM, then 0; 2 for a model or params file it cannot serve."""
    if args.sb3 is None:
        print(f"{SERVER_NAME}: this backend serves --sb3 MODEL_ZIP", file=sys.stderr)
        return EXIT_BAD_INPUT
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)  # one robot's observation at a time: a small network does not gain from threads
    return load_and_serve(args, load, (ModelError, ConfigMismatch, ConfigError))


def main(argv: Sequence[str] | None = None) -> int:
    return serve(parse(list(argv) if argv is not None else None))


if __name__ == "__main__":
    sys.exit(main())
