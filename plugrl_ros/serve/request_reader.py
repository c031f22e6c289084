"""An openpi request read into an RLlib checkpoint's observation space, by the bridge's own params file.

In deploy mode the bridge sends each robot's observation as a map whose keys
its ``policy.observations`` section names (``state/joints: states.joints``,
``observation/image: images.wrist``; see :mod:`plugrl_ros.params.policy`). A
policy trained through :class:`~plugrl_ros.rllib.PlugRLEnvRunner` reads
``{"states": {name: ...}, "images": {name: ...}}`` (:func:`robot_spaces`). The
same params file tells both sides: :meth:`RequestReader.from_params_file`
inverts the section (every state and image the checkpoint reads must be sent
under some key) and checks the file against the checkpoint before anything
is served: each state's width and image's size that the file fixes, and the
sinks' action width and limits against the checkpoint's action space (which
also gives H, the steps per chunk). A file of another robot is refused
naming the key that differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_ros.params.policy import SECTION, load_policy_config
from plugrl_ros.params.section import ConfigError, Section
from plugrl_ros.protocol.policy.request import RequestLayout
from plugrl_ros.serve.chunks import ChunkMapping
from plugrl_ros.serve.observations import GROUPS, ObservationReader, SpaceMismatch
from plugrl_ros.serve.spaces import ParamsFiles, _parameters, robot_spaces


class ConfigMismatch(ValueError):
    """The params file describes another robot than the checkpoint was trained for."""


@dataclass(frozen=True)
class RequestReader:
    """Which request key holds each state and image of the observation space, and the chunk's shape."""

    keys: dict[tuple[str, str], tuple[str, ...]]  # (group, name) -> the request's key path
    separator: str
    space: gym.spaces.Dict
    chunks: ChunkMapping
    text_key: tuple[str, ...] | None = None  # the request's key path of the text source, if the file sends it

    @classmethod
    def from_params_file(
        cls,
        params_file: ParamsFiles,
        observation_space: gym.spaces.Space,
        action_space: gym.spaces.Space,
        horizon: int | None = None,
    ) -> RequestReader:
        """The reader for a checkpoint of these spaces, from the bridge's params file (ConfigMismatch if unlike).

        ``horizon``: H, if the caller knows it; otherwise the checkpoint's action
        width over the width of one step of the file's sinks.
        """
        ObservationReader(observation_space)  # a robot_spaces()-shaped Dict, or ValueError saying so
        assert isinstance(observation_space, gym.spaces.Dict)
        wanted = [(group, name) for group in GROUPS for name in observation_space.spaces.get(group, {})]
        values = _parameters(params_file)
        configured = Section(values, "").section("observations")
        sources = {f"{group}.{name}" for group in GROUPS for name in configured.section(group).names()}
        if SECTION not in values:
            raise ConfigMismatch(
                f"{params_file}: has no {SECTION} section; the server reads which request key holds which state "
                f"or image from {SECTION}.observations, as the bridge in deploy mode sends them"
            )
        layout = load_policy_config(values[SECTION], sources | {"text"}, prefix=SECTION).layout
        keys = _keys(layout, wanted, params_file)
        spaces = _file_spaces(params_file, observation_space, action_space, horizon)
        text = next((item.path for item in layout.inputs if item.source == "text"), None)
        return cls(keys, layout.separator, observation_space, spaces, text)

    def observation(self, request: Any) -> dict[str, dict[str, np.ndarray]]:
        """One observation of :attr:`space` from a decoded request; SpaceMismatch naming the key otherwise."""
        if not isinstance(request, Mapping):
            raise SpaceMismatch("request", f"must be a map of the observation's keys, got a {type(request).__name__}")
        batch: dict[str, dict[str, np.ndarray]] = {}
        for (group, name), path in self.keys.items():
            value = _lookup(request, path, self.separator)
            key = self.separator.join(path) if self.separator else "/".join(path)
            if value is None:
                raise SpaceMismatch(
                    key,
                    f"is missing from the request: the policy reads {group}.{name} from it "
                    f"(the request's keys: {sorted(map(str, request))})",
                )
            batch.setdefault(group, {})[name] = np.asarray(value)[None]
        try:
            (row,) = ObservationReader(self.space).rows(batch, 1, "request")
        except SpaceMismatch as exc:
            raise SpaceMismatch(exc.args[0] if exc.args else "request", str(exc)) from None
        return row

    def text(self, request: Mapping) -> str | None:
        """The request's text (a language policy's task), if the file sends one ("" if this request has none)."""
        if self.text_key is None:
            return None
        return str(_lookup(request, self.text_key, self.separator) or "")


def states_vector_space(width: int, params_file: ParamsFiles, states: list[str]) -> gym.spaces.Dict:
    """The ``{"states": ...}`` space of a policy that reads one vector of ``width`` values: the file's ``states``
    concatenated in that order, each as wide as the file fixes it (one width the messages set may be left for
    the rest to fill); ConfigMismatch if they cannot add up to ``width``."""
    widths: dict[str, int | None] = {}
    for name in states:
        try:
            box = robot_spaces(params_file, states=[name], images=[]).observation_space["states"][name]
            widths[name] = int(box.shape[0])
        except ConfigError:
            widths[name] = None  # its width depends on the messages
    unknown = [name for name, size in widths.items() if size is None]
    rest = width - sum(size for size in widths.values() if size is not None)
    if len(unknown) > 1 or (unknown and rest < 1) or (not unknown and rest != 0):
        raise ConfigMismatch(
            f"the policy reads one vector of {width} values; the file's states {states} in name order "
            f"are {widths} wide (None: set by the messages)"
        )
    if unknown:
        widths[unknown[0]] = rest
    return gym.spaces.Dict(
        {"states": gym.spaces.Dict({n: gym.spaces.Box(-np.inf, np.inf, (w,), np.float32) for n, w in widths.items()})}
    )


def _keys(
    layout: RequestLayout, wanted: list[tuple[str, str]], params_file: ParamsFiles
) -> dict[tuple[str, str], tuple[str, ...]]:
    sent = {item.source: item.path for item in layout.inputs}
    keys = {}
    for group, name in wanted:
        source = f"{group}.{name}"
        if source not in sent:
            raise ConfigMismatch(
                f"{params_file}: {SECTION}.observations sends no key with {source}, which the checkpoint's policy "
                f"reads; map a request key to it (it sends: {', '.join(sorted(sent)) or 'nothing'})"
            )
        keys[group, name] = sent[source]
    return keys


def _file_spaces(
    params_file: ParamsFiles, observation_space: gym.spaces.Dict, action_space: gym.spaces.Space, horizon: int | None
) -> ChunkMapping:
    """Check the file's widths against the checkpoint's spaces; the chunk's shape."""
    states = observation_space.spaces.get("states", gym.spaces.Dict({}))
    images = observation_space.spaces.get("images", gym.spaces.Dict({}))
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise ConfigMismatch(f"the checkpoint's action space is {action_space}, not a flat Box of a robot's chunk")
    size = action_space.shape[0]
    try:
        # the checkpoint's widths where the file leaves them open; where the file fixes one, it must agree
        spaces = robot_spaces(
            params_file,
            horizon=1,
            states=list(states.spaces),
            images=list(images.spaces),
            state_dims={name: int(box.shape[0]) for name, box in states.spaces.items()},
            image_shapes={name: list(box.shape) for name, box in images.spaces.items()},
            action_dim=None if horizon is None else size // horizon,
        )
    except ConfigError as exc:
        raise ConfigMismatch(
            f"{params_file} does not describe the robot the checkpoint was trained for: {exc}"
        ) from exc
    except ValueError as exc:
        raise ConfigMismatch(f"{params_file}: {exc}") from None
    if spaces.observation_space != observation_space:
        raise ConfigMismatch(
            f"{params_file}: its observation space {spaces.observation_space} is not the checkpoint's "
            f"{observation_space}"
        )
    step = spaces.step_action_space
    width = step.shape[0]
    if size % width or (horizon is not None and size != horizon * width):
        raise ConfigMismatch(
            f"{params_file}: its sinks read {width} values per step, but the checkpoint's actions are {size} wide"
            + (f", not {horizon} steps of {width}" if horizon is not None else ", not a whole number of steps")
        )
    chunks = ChunkMapping(size // width, width)
    expected = chunks.chunk_space(step)
    if not (np.array_equal(expected.low, action_space.low) and np.array_equal(expected.high, action_space.high)):
        raise ConfigMismatch(
            f"{params_file}: its sinks clip each step to [{step.low.tolist()}, {step.high.tolist()}], but the "
            f"checkpoint's action space per step is [{action_space.low[:width].tolist()}, "
            f"{action_space.high[:width].tolist()}]: another robot's limits"
        )
    return chunks


def _lookup(request: Mapping, path: tuple[str, ...], separator: str) -> Any:
    if separator:
        return request.get(separator.join(path))
    node: Any = request
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node
