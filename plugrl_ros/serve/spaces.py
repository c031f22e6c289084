"""The robot's observation and action spaces, read from the bridge's own params file.

One file describes the robot to both sides: the bridge subscribes and
publishes by it, and the trainer builds its RLlib spaces from it. Each
configured state becomes a float32 ``Box`` of its width, each image a uint8
``Box`` of its size, both under a ``Dict`` shaped like a PlugRL observation
(``{"states": {...}, "images": {...}}``; ``text`` is not a space). The step's
action is a ``Box`` as wide as the sinks read, bounded where the sinks clip:
a sink publishes ``value * scale + offset`` clipped to ``[min, max]``, so the
trainer's bound is ``(min - offset) / scale``. The RL step's action is the
whole chunk (:mod:`plugrl_ros.serve.chunks`).

Only what the file itself fixes is read; no ROS is needed. A width the file
cannot tell (a ``Float64MultiArray`` state without ``slice``, a state of any other
type read by field paths, an image without
``resize``, a ``Float64MultiArray`` actuator without ``slice``, which takes the
whole action, as wide as the trainer sends it) must be given (``state_dims``,
``image_shapes``, ``action_dim``) and a missing one is an error naming the key.
Everything else of the file is the bridge's to check at its startup.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import yaml

from plugrl_ros.params.section import ConfigError, Section, nest
from plugrl_ros.serve.chunks import ChunkMapping

# one params file, or several in the order the bridge's --params-file options give them
ParamsFiles = str | Path | Sequence[str | Path]

# state message types whose width is fixed: one value
_SCALAR_STATES = {"Float64", "Float32"}
_MULTI_ARRAY_STATES = {"Float64MultiArray", "Float32MultiArray"}
_GEOMETRY_STATES = {"Imu", "Odometry", "PoseStamped", "TwistStamped", "WrenchStamped"}
_JOINT_STATE_FIELDS = ("position",)
_DEFAULT_CHANNELS = 3


@dataclass(frozen=True)
class RobotSpaces:
    """What the trainer's RLModule sees of a robot, and what it commands."""

    observation_space: gym.spaces.Dict  # {"states": {name: Box f32}, "images": {name: Box u8}}
    step_action_space: gym.spaces.Box  # one control step's action, float32 [action_dim]
    chunks: ChunkMapping

    @property
    def action_space(self) -> gym.spaces.Box:
        """The RL step's action: the whole chunk, float32 [horizon * action_dim]."""
        return self.chunks.chunk_space(self.step_action_space)

    @property
    def horizon(self) -> int:
        return self.chunks.horizon


def robot_spaces(
    params_file: ParamsFiles,
    *,
    horizon: int = 1,
    states: Sequence[str] | None = None,
    images: Sequence[str] | None = None,
    state_dims: Mapping[str, int] | None = None,
    image_shapes: Mapping[str, Sequence[int]] | None = None,
    action_dim: int | None = None,
    recorded: Mapping[str, Sequence[int]] | None = None,
) -> RobotSpaces:
    """The spaces of the robot the bridge's ``params_file`` describes.

    ``states`` and ``images`` choose the names the policy reads (default: every
    one the file configures; the bridge may send more, which the runner
    ignores). ``state_dims`` and ``image_shapes`` give the widths the file
    cannot tell; ``action_dim`` the width of one step's action where the file
    leaves it to the trainer (an actuator that takes the whole action), and
    must match the file's actuators otherwise. ``horizon`` is H, the steps per
    action chunk. ``recorded``: the shapes a recording holds, keyed
    ``states/NAME`` and ``images/NAME``; they give a width neither the file nor
    ``state_dims``/``image_shapes`` gives, and must match one the file fixes.
    With them, the default names are those the file configures and the
    recording holds.
    """
    values = _parameters(params_file)
    root = Section(values, "")
    observations = root.section("observations")
    chosen_states = _chosen(observations.section("states"), states, "states", recorded)
    chosen_images = _chosen(observations.section("images"), images, "images", recorded)
    state_dims = dict(state_dims or {})
    image_shapes = {name: tuple(shape) for name, shape in (image_shapes or {}).items()}
    _check_overrides(state_dims, chosen_states, "state_dims")
    _check_overrides(image_shapes, chosen_images, "image_shapes")
    for key, shape in (recorded or {}).items():
        group, _, name = key.partition("/")
        if group == "states" and name in chosen_states and len(shape) == 1:
            state_dims.setdefault(name, int(shape[0]))
        elif group == "images" and name in chosen_images:
            image_shapes.setdefault(name, tuple(int(n) for n in shape))
    groups: dict[str, gym.spaces.Dict] = {}
    if chosen_states:
        groups["states"] = gym.spaces.Dict(
            {
                name: _state_box(observations.section("states").section(name), state_dims.get(name))
                for name in chosen_states
            }
        )
    if chosen_images:
        groups["images"] = gym.spaces.Dict(
            {
                name: _image_box(observations.section("images").section(name), image_shapes.get(name))
                for name in chosen_images
            }
        )
    if not groups:
        raise ConfigError("observations", {}, "the policy must read at least one state or image")
    if action_dim is not None and (not isinstance(action_dim, int) or isinstance(action_dim, bool) or action_dim < 1):
        raise ValueError(f"action_dim must be an integer of at least 1, got {action_dim!r}")
    low, high = _action_bounds(root.section("actions", required=True), action_dim)
    if action_dim is not None and low.shape[0] != action_dim:
        raise ValueError(
            f"action_dim={action_dim}, but the file's actuators read {low.shape[0]} values per step: "
            "leave action_dim out, or make the actuators read that many"
        )
    step_space = gym.spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
    return RobotSpaces(gym.spaces.Dict(groups), step_space, ChunkMapping(horizon, low.shape[0]))


# -- the file ---------------------------------------------------------------------------


def configured_names(params_file: ParamsFiles) -> tuple[list[str], list[str]]:
    """The names of the states and of the images the params file configures, each sorted."""
    observations = _parameters(params_file).get("observations", {})
    return sorted((observations.get("states") or {}).keys()), sorted((observations.get("images") or {}).keys())


def _parameters(params_files: ParamsFiles) -> dict[str, Any]:
    """The nested ``ros__parameters`` of a params file, or of several read in order as rcl reads
    ``--params-file`` after ``--params-file`` (a later file's value wins), with dotted names folded in."""
    paths = [params_files] if isinstance(params_files, (str, Path)) else list(params_files)
    values: dict[str, Any] = {}
    for path in map(Path, paths):
        values.update(_flat(_node_section(path)))
    return nest(values)


def _node_section(path: Path) -> dict[str, Any]:
    """The one node section's ``ros__parameters`` of the params file at ``path``."""
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(str(path), None, f"the params file cannot be read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), None, f"not valid YAML: {exc}") from None
    sections = [
        value["ros__parameters"]
        for value in (document.values() if isinstance(document, dict) else [])
        if isinstance(value, dict) and isinstance(value.get("ros__parameters"), dict)
    ]
    if len(sections) != 1:
        raise ConfigError(
            str(path), None, f"expected one node section with ros__parameters (like '/**:'), found {len(sections)}"
        )
    return sections[0]


def _flat(tree: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for name, value in tree.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, Mapping):
            yield from _flat(value, key)
        else:
            yield key, value


def _chosen(
    section: Section, names: Sequence[str] | None, what: str, recorded: Mapping[str, Sequence[int]] | None
) -> list[str]:
    configured = section.names()
    if names is None:
        return sorted(name for name in configured if recorded is None or f"{what}/{name}" in recorded)
    unknown = [name for name in names if name not in configured]
    if unknown:
        raise ConfigError(
            section.key(unknown[0]), None, f"the file configures no such {what[:-1]}; it has: {', '.join(configured)}"
        )
    return sorted(set(names))


def _check_overrides(given: Mapping[str, Any], chosen: Sequence[str], what: str) -> None:
    extra = sorted(set(given) - set(chosen))
    if extra:
        raise ValueError(f"{what} names {extra}, which the policy does not read (it reads {list(chosen)})")


# -- observations -----------------------------------------------------------------------


def _state_box(section: Section, given: int | None) -> gym.spaces.Box:
    if section.has("parts"):
        parts = section.str_list("parts", nonempty=True)
        widths = [_state_width(section.section(part, required=True)) for part in parts]
        width = None if None in widths else sum(w for w in widths if w is not None)
    else:
        width = _state_width(section)
    if given is not None:
        if given < 1:
            raise ValueError(f"state_dims[{section.prefix.rsplit('.', 1)[-1]!r}] must be at least 1, got {given}")
        if width is not None and width != given:
            raise ConfigError(section.prefix, given, f"the file fixes this state's width at {width}")
        width = given
    if width is None:
        raise ConfigError(
            section.prefix,
            None,
            f"its width depends on the messages; pass state_dims={{'{section.prefix.rsplit('.', 1)[-1]}': N}}",
        )
    return gym.spaces.Box(-np.inf, np.inf, (width,), np.float32)


def _state_width(section: Section) -> int | None:
    """The values one state source contributes, when its keys fix them."""
    kind = section.str("type").rsplit("/", 1)[-1]
    if section.has("slice"):
        start, stop = section.int_list("slice", length=2)
        if not 0 <= start < stop:
            raise ConfigError(section.key("slice"), [start, stop], "expected [start, stop] with 0 <= start < stop")
        return stop - start
    if kind == "JointState":
        fields = section.str_list("fields") if section.has("fields") else list(_JOINT_STATE_FIELDS)
        return len(section.str_list("joints", nonempty=True)) * len(fields)
    if kind in _SCALAR_STATES:
        return 1
    if kind in _GEOMETRY_STATES and section.has("fields"):
        return len(section.str_list("fields", nonempty=True))
    if kind == "LaserScan":
        beams = section.int("beams")
        return beams * (2 if section.has("intensities") and section.bool("intensities") else 1)
    # a multi-array without slice, and any other type read by field paths: its width depends on the
    # messages or on the type's definition, which this side does not import (state_dims gives it)
    return None


def _image_box(section: Section, given: tuple[int, ...] | None) -> gym.spaces.Box:
    channels = section.int("channels") if section.has("channels") else _DEFAULT_CHANNELS
    size = None
    if section.has("resize"):
        size = tuple(section.int_list("resize", length=2))
    elif section.has("crop"):
        size = tuple(section.int_list("crop", length=4)[2:])
    shape = None if size is None else (*size, channels)
    if given is not None:
        if len(given) != 3 or min(given) < 1:
            raise ValueError(f"image_shapes[{section.prefix.rsplit('.', 1)[-1]!r}] must be [h, w, c], got {given}")
        if shape is not None and shape != given:
            raise ConfigError(section.prefix, list(given), f"the file fixes this image at {list(shape)}")
        shape = given
    if shape is None:
        name = section.prefix.rsplit(".", 1)[-1]
        raise ConfigError(
            section.prefix, None, f"without resize its size is the camera's; pass image_shapes={{'{name}': [h, w, c]}}"
        )
    return gym.spaces.Box(0, 255, shape, np.uint8)


# -- actions ----------------------------------------------------------------------------


def _action_bounds(section: Section, action_dim: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Per element of the step's action vector: the trainer-side [low, high] the sinks clip it to."""
    slices = []
    for name in section.names():
        action = section.section(name)
        start, stop = _action_slice(action, action_dim)
        width = stop - start
        scale = np.array(action.float_list("scale", length=width))
        offset = np.array(action.float_list("offset", length=width))
        if np.any(scale == 0):
            raise ConfigError(action.key("scale"), scale.tolist(), "a zero scale makes the action meaningless")
        low = np.array(action.float_list("min", length=width)) if action.has("min") else np.full(width, -math.inf)
        high = np.array(action.float_list("max", length=width)) if action.has("max") else np.full(width, math.inf)
        # the sink publishes value * scale + offset clipped to [min, max]: back into the trainer's units
        with np.errstate(invalid="ignore"):
            a, b = (low - offset) / scale, (high - offset) / scale
        slices.append((start, stop, np.minimum(a, b), np.maximum(a, b)))
    if not slices:
        raise ConfigError(section.prefix, {}, "configure at least one action sink")
    width = max(stop for _, stop, _, _ in slices)
    low, high = np.full(width, -math.inf), np.full(width, math.inf)
    for start, stop, lo, hi in slices:  # sinks sharing an element: the tighter bound holds
        low[start:stop] = np.maximum(low[start:stop], lo)
        high[start:stop] = np.minimum(high[start:stop], hi)
    return low, high


def _action_slice(action: Section, action_dim: int | None) -> tuple[int, int]:
    kind = action.str("type").rsplit("/", 1)[-1]
    if kind in ("JointState", "JointTrajectory"):
        width: int | None = len(action.str_list("joints", nonempty=True))
    elif kind in ("Twist", "TwistStamped"):
        width = len(action.str_list("fields", nonempty=True))
    elif kind == "Float64":
        width = 1
    elif kind == "Float64MultiArray":
        width = None
    elif not action.has("slice"):
        # any other type (or an action server's goal) is filled by field paths: their width is the type's
        raise ConfigError(
            action.key("slice"),
            None,
            f"{action.str('type')} is filled by field paths, whose width this side cannot read without the "
            "type: give the actuator's slice [start, stop]",
        )
    else:
        width = None
    if action.has("slice"):
        start, stop = action.int_list("slice", length=2)
        if not 0 <= start < stop:
            raise ConfigError(action.key("slice"), [start, stop], "expected [start, stop] with 0 <= start < stop")
        return start, stop
    if width is None:
        # the bridge's whole-action actuator: as wide as the trainer sends it, so the trainer says how wide
        if action_dim is None:
            raise ConfigError(
                action.prefix,
                None,
                "without slice this actuator takes the whole action, as wide as the trainer sends it: "
                "pass robot_spaces(..., action_dim=N)",
            )
        return 0, action_dim
    return 0, width
