"""A planar two-link reacher in numpy: velocity-controlled joints, a target to touch, a small camera picture.

The arm's two revolute joints (``shoulder``, ``elbow``) take velocity
commands that the motors track with a short lag, within joint limits. Each
episode draws a start pose and a target pose at random; the policy sees the
target relative to the arm, both as the fingertip-to-target offset (x, y) and
as the joint-angle offsets that reach it, so a linear policy can learn the
task, while the camera shows the same scene. Reward per step: minus the fingertip-to-target distance (metres),
minus a small action cost. The episode terminates once the fingertip has
stayed within a tolerance of the target for a few consecutive steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

JOINT_NAMES = ("shoulder", "elbow")

_BACKGROUND = (32, 32, 40)
_TARGET = (230, 60, 50)
_LINKS = (90, 160, 240)
_BASE = (200, 200, 200)
_TIP = (120, 230, 120)
_SUBPIXEL_BITS = 4  # cv2 drawing with fractional coordinates: smoother pictures at 64x64


@dataclass(frozen=True)
class ReacherSpec:
    """The arm and the task; every reacher of a run shares one."""

    link_lengths: tuple[float, float] = (0.1, 0.1)  # metres
    dt: float = 0.05  # seconds of simulated time per step
    max_speed: float = 2.0  # rad/s; larger commands are clipped (the bridge clips to the same limits)
    response_s: float = 0.1  # time constant of the motors' velocity tracking
    joint_limit: float = 2.6  # rad, both joints: the arm stops there
    start_margin: float = 0.3  # start and target poses stay this far inside the limits
    min_target_distance: float = 0.05  # metres between the fingertip at the start and the target
    tolerance: float = 0.02  # metres: the fingertip this close to the target is on it ...
    hold_steps: int = 3  # ... for this many consecutive steps: the episode terminates
    action_cost: float = 0.005  # per (rad/s)^2 of command

    @property
    def reach(self) -> float:
        return float(sum(self.link_lengths))


def fingertip(spec: ReacherSpec, q: np.ndarray) -> np.ndarray:
    """Forward kinematics: the fingertip's (x, y) in metres for joint angles ``q``."""
    l1, l2 = spec.link_lengths
    a1, a12 = q[0], q[0] + q[1]
    return np.array([l1 * np.cos(a1) + l2 * np.cos(a12), l1 * np.sin(a1) + l2 * np.sin(a12)])


def elbow(spec: ReacherSpec, q: np.ndarray) -> np.ndarray:
    l1 = spec.link_lengths[0]
    return np.array([l1 * np.cos(q[0]), l1 * np.sin(q[0])])


class Reacher:
    """One arm: state, physics step, reward, termination, seeded reset and rendering."""

    def __init__(self, spec: ReacherSpec, rng: np.random.Generator) -> None:
        self.spec = spec
        self._rng = rng
        self.q = np.zeros(2)  # joint angles, rad
        self.qd = np.zeros(2)  # joint velocities, rad/s
        self.target_q = np.zeros(2)
        self.target = np.zeros(2)  # the target point, metres
        self.steps = 0
        self._on_target = 0
        self.reset()

    def reset(self) -> None:
        """A new episode: random start and target poses, the arm at rest."""
        spec = self.spec
        bound = spec.joint_limit - spec.start_margin
        self.q = self._rng.uniform(-bound, bound, size=2)
        self.qd = np.zeros(2)
        start = fingertip(spec, self.q)
        # A target on top of the start would be an episode with nothing to learn.
        for _ in range(100):
            self.target_q = self._rng.uniform(-bound, bound, size=2)
            self.target = fingertip(spec, self.target_q)
            if np.linalg.norm(self.target - start) >= spec.min_target_distance:
                break
        self.steps = 0
        self._on_target = 0

    def distance(self) -> float:
        return float(np.linalg.norm(fingertip(self.spec, self.q) - self.target))

    def step(self, command: np.ndarray, dt: float | None = None) -> tuple[float, bool]:
        """Apply joint velocity ``command`` (rad/s) for one step of ``dt`` seconds; (reward, terminated)."""
        spec = self.spec
        dt = spec.dt if dt is None else dt
        u = np.clip(np.nan_to_num(np.asarray(command, dtype=np.float64).reshape(2)), -spec.max_speed, spec.max_speed)
        self.qd = self.qd + (u - self.qd) * min(1.0, dt / spec.response_s)
        q = self.q + self.qd * dt
        at_limit = np.abs(q) >= spec.joint_limit
        self.q = np.clip(q, -spec.joint_limit, spec.joint_limit)
        self.qd = np.where(at_limit, 0.0, self.qd)
        self.steps += 1
        distance = self.distance()
        self._on_target = self._on_target + 1 if distance <= spec.tolerance else 0
        reward = -distance - spec.action_cost * float(u @ u)
        return reward, self._on_target >= spec.hold_steps

    def target_state(self) -> np.ndarray:
        """What the ``target`` topic carries: the target relative to the arm.

        [dx, dy] from the fingertip to the target (metres), then [shoulder,
        elbow] joint-angle offsets that put the fingertip on it (rad).
        """
        return np.concatenate([self.target - fingertip(self.spec, self.q), self.target_q - self.q])

    def render(self, size: int = 64) -> np.ndarray:
        """The scene from above as ``uint8 [size, size, 3]`` RGB: arm, fingertip and target (needs OpenCV)."""
        import cv2  # optional (plugrl_ros.opencv): only the camera needs it

        spec = self.spec
        image = np.empty((size, size, 3), dtype=np.uint8)
        image[:] = _BACKGROUND
        scale = (size / 2 - 2) / (spec.reach * 1.1)  # pixels per metre, the whole workspace in view
        unit = 1 << _SUBPIXEL_BITS

        def pixel(point: np.ndarray) -> tuple[int, int]:
            # image rows grow downwards, y grows upwards
            return (round((size / 2 + point[0] * scale) * unit), round((size / 2 - point[1] * scale) * unit))

        width = max(1, size // 32)
        radius = max(2, size // 20) * unit
        cv2.circle(image, pixel(self.target), radius, _TARGET, -1, cv2.LINE_AA, _SUBPIXEL_BITS)
        base, mid, tip = np.zeros(2), elbow(spec, self.q), fingertip(spec, self.q)
        cv2.line(image, pixel(base), pixel(mid), _LINKS, width, cv2.LINE_AA, _SUBPIXEL_BITS)
        cv2.line(image, pixel(mid), pixel(tip), _LINKS, width, cv2.LINE_AA, _SUBPIXEL_BITS)
        cv2.circle(image, pixel(base), radius // 2 + unit, _BASE, -1, cv2.LINE_AA, _SUBPIXEL_BITS)
        cv2.circle(image, pixel(tip), radius // 2 + unit // 2, _TIP, -1, cv2.LINE_AA, _SUBPIXEL_BITS)
        return image
