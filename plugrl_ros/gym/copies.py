"""Copies of one Gymnasium env with deterministic episode seeds, stepped without ROS.

The robot node, the in-process (direct) client and the tests that replay a
recording all step envs through :class:`GymCopy`, so the three agree on what
an episode is: episode ``k`` of copy ``i`` starts with
``env.reset(seed=episode_seed(seed, i, k))``, whatever happened before it (a
reconnect, an episode cut short), and the action reaches the env through the
one conversion of :mod:`plugrl_ros.gym.spaces`.
"""

from __future__ import annotations

import argparse
import importlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from plugrl_ros.gym.spaces import ActionLayout, ObservationKey, action_layout, observation_keys
from plugrl_ros.protocol.messages import ObservationRow

# The camera's name: the trainer's images.camera, the topic camera/image_raw.
CAMERA = "camera"


class EnvUnavailable(RuntimeError):
    """The env cannot be made or rendered here; the message says what to install or set."""


@dataclass(frozen=True)
class Camera:
    """A rendered picture per step, ``width`` by ``height`` RGB."""

    width: int
    height: int

    @classmethod
    def parse(cls, text: str) -> Camera:
        """``WIDTHxHEIGHT`` (e.g. ``64x64``), as the command lines take it."""
        try:
            width, height = (int(part) for part in text.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT, e.g. 64x64") from None
        if not (8 <= width <= 4096 and 8 <= height <= 4096):
            raise argparse.ArgumentTypeError(f"{text!r}: width and height must be 8..4096 pixels")
        return cls(width, height)


def episode_seed(seed: int, copy: int, episode: int) -> int:
    """The seed of episode ``episode`` (0, 1, ...) of copy ``copy``: a 32-bit number drawn from all three."""
    return int(np.random.SeedSequence([seed, copy, episode]).generate_state(1)[0])


def env_spec(env_id: str) -> Any:
    """The registered spec of ``env_id``; ``module:ID`` imports ``module`` first (it registers the env), as
    ``gymnasium.make`` does: how a team's own envs are named."""
    import gymnasium

    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EnvUnavailable(f"{env_id}: the module {module!r} that should register {name} cannot be imported: "
                                 f"{exc}") from None  # fmt: skip
    try:
        return gymnasium.spec(name)
    except gymnasium.error.Error as exc:
        raise EnvUnavailable(f"{env_id}: {exc}") from None


def _is_mujoco(spec: Any) -> bool:
    return isinstance(spec.entry_point, str) and spec.entry_point.startswith("gymnasium.envs.mujoco")


def make_env(env_id: str, camera: Camera | None = None) -> Any:
    """``gymnasium.make(env_id)``, rendering ``rgb_array`` pictures of the camera's size if one is asked for.

    MuJoCo envs render at that size themselves; other envs' pictures are resized.
    Headless MuJoCo rendering needs an OpenGL platform: ``MUJOCO_GL=egl`` (the
    default set here when none is) or ``osmesa``.
    """
    import gymnasium

    spec = env_spec(env_id)
    kwargs: dict[str, Any] = {}
    if camera is not None:
        kwargs["render_mode"] = "rgb_array"
        if _is_mujoco(spec):
            # before mujoco is imported: without a display, GLFW (its default) cannot make a context
            os.environ.setdefault("MUJOCO_GL", "egl")
            kwargs.update(width=camera.width, height=camera.height)
        else:
            # classic control draws with pygame: no sound card is wanted, nor its greeting on stdout
            os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
            os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    try:
        return gymnasium.make(spec.id, **kwargs)
    except (ImportError, gymnasium.error.DependencyNotInstalled) as exc:
        raise EnvUnavailable(
            f"{env_id} needs a package that is not installed ({exc}); pip install 'plugrl_ros[gym]' "
            "brings Gymnasium's classic-control and MuJoCo envs"
        ) from None


def check_camera(env_id: str, camera: Camera) -> None:
    """Render one picture of a throwaway copy of the env: :class:`EnvUnavailable` with the fix if it fails."""
    env = make_env(env_id, camera)
    try:
        env.reset(seed=0)
        picture = env.render()
    except Exception as exc:  # any rendering backend failure: it is reported with what to do
        hint = (
            f" (MUJOCO_GL={os.environ.get('MUJOCO_GL', '')}: headless rendering needs libEGL and Mesa's drivers, "
            "e.g. apt install libegl1 libgl1-mesa-dri, or MUJOCO_GL=osmesa with libosmesa6)"
            if _is_mujoco(env.spec)
            else ""
        )
        raise EnvUnavailable(
            f"{env_id} cannot render a camera picture here: {type(exc).__name__}: {exc}{hint}"
        ) from exc
    finally:
        env.close()
    if not (isinstance(picture, np.ndarray) and picture.ndim == 3 and picture.shape[2] == 3):
        raise EnvUnavailable(f"{env_id} renders {type(picture).__name__}, not an RGB picture: it has no camera")


@dataclass(frozen=True)
class StepResult:
    reward: float
    terminated: bool
    truncated: bool


class GymCopy:
    """Copy ``index`` of an env: seeded resets, checked steps, its observation split into states."""

    def __init__(self, env_id: str, index: int, seed: int, camera: Camera | None = None) -> None:
        self.env = make_env(env_id, camera)
        self.index = index
        self.seed = seed
        self.camera = camera
        self.keys: tuple[ObservationKey, ...] = observation_keys(self.env.observation_space)
        self.action: ActionLayout = action_layout(self.env.action_space)
        self.episodes = 0  # resets so far; the next one is episode number `episodes`
        self.observation: Any = None
        self.over = True  # no episode runs: before the first reset, and after an episode's end
        self.steps = 0  # steps of the running episode
        self.steps_total = 0  # steps of every episode

    def reset(self) -> int:
        """Start the next episode; the seed it was reset with."""
        seed = episode_seed(self.seed, self.index, self.episodes)
        self.observation, _ = self.env.reset(seed=seed)
        self.episodes += 1
        self.over = False
        self.steps = 0
        return seed

    def step(self, values: np.ndarray) -> StepResult:
        """One ``env.step`` with the action vector ``values`` (checked: see :meth:`ActionLayout.problem`)."""
        assert not self.over, "the episode is over: reset first"
        observation, reward, terminated, truncated, _ = self.env.step(self.action.to_env(values))
        self.observation = observation
        self.steps += 1
        self.steps_total += 1
        self.over = bool(terminated or truncated)
        return StepResult(float(reward), bool(terminated), bool(truncated))

    def states(self) -> dict[str, np.ndarray]:
        """The current observation as flat float64 states, by name."""
        return {key.name: key.values(self.observation) for key in self.keys}

    def picture(self) -> np.ndarray:
        """The camera's picture of the current state: uint8 [height, width, 3]."""
        assert self.camera is not None
        picture = np.ascontiguousarray(self.env.render(), dtype=np.uint8)
        height, width = self.camera.height, self.camera.width
        if picture.shape[:2] != (height, width):
            import cv2  # only envs that cannot render at a size of their choosing

            picture = cv2.resize(picture, (width, height), interpolation=cv2.INTER_AREA)
        return picture

    def row(self) -> ObservationRow:
        """What a trainer receives for this copy: the states, and the camera's picture if there is one."""
        images = {CAMERA: self.picture()} if self.camera is not None else {}
        return ObservationRow(images=images, states=self.states(), text="")

    def close(self) -> None:
        self.env.close()


class GymCopies:
    """``n`` copies stepped in-process, with the interface the headless client steps envs through."""

    def __init__(self, env_id: str, n: int, seed: int, camera: Camera | None = None) -> None:
        self.copies = [GymCopy(env_id, i, seed, camera) for i in range(n)]
        for copy in self.copies:
            copy.reset()  # episode 0, as a bridge's reset at its start makes it on the robot
        self.n = n
        self.action_dim = self.copies[0].action.width

    def step(self, env: int, action: np.ndarray) -> tuple[float, bool, bool]:
        """Copy ``env`` takes ``action``, clipped as the generated bridge config clips it: (reward, terminated,
        truncated). A NaN or infinite value is refused (ValueError), as the robot refuses it."""
        copy = self.copies[env]
        values = copy.action.clip(np.asarray(action, dtype=np.float64).reshape(-1))
        problem = copy.action.problem(values)
        if problem is not None:
            raise ValueError(f"env {env}: the action cannot be taken: {problem}")
        result = copy.step(values)
        return result.reward, result.terminated, result.truncated

    def reset(self, env: int) -> None:
        self.copies[env].reset()

    def row(self, env: int) -> ObservationRow:
        return self.copies[env].row()

    def close(self) -> None:
        for copy in self.copies:
            copy.close()
