"""What train mode tells an observer of its transitions (the node hands it the recorder when recording).

Train mode knows no recorder: it calls these methods on whatever the node
gave it. Every call must return at once and must not modify or keep a
mutable view it will later change (arrays passed are never modified
afterwards by train mode). Times are integer nanoseconds of the node's clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import numpy as np

from plugrl_ros.protocol.messages import ObservationRow

# With a person in the loop, each step says: (a person commanded it; the policy's action did not run, the
# person's command or an idle did; the person's command in action units before shaping, or None)
Intervention = tuple[bool, bool, "np.ndarray | None"]


class TransitionObserver(Protocol):
    def observation(self, env: int, t_ns: int, row: ObservationRow, sent_in: Literal["infer", "feedback"]) -> None: ...
    def chunk(self, env: int, t_ns: int, action: np.ndarray) -> None: ...
    def step(
        self,
        env: int,
        t_ns: int,
        chunk_step: int | None,
        commanded: Mapping[str, np.ndarray | None],
        applied: np.ndarray | None = None,
        intervention: Intervention | None = None,
    ) -> None: ...
    def step_result(
        self, env: int, t_ns: int, reward: float, terminated: bool, truncated: bool, success: bool
    ) -> None: ...
    def episode_end(self, env: int, t_ns: int, ret: float, length: int, success: bool) -> None: ...
    def link_event(
        self,
        t_ns: int,
        kind: str,
        epoch: int,
        code: int | None = None,
        reason: str = "",
        dropped_envs: Sequence[int] = (),
        detail: Mapping[str, Any] | None = None,
    ) -> None: ...
    def latency(self, t_ns: int, seconds: float) -> None: ...
