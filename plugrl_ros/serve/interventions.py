"""A person's corrections as RL steps: what a chunk executed, from a feedback's ``info["intervention"]``.

With a person in the loop the bridge says, per feedback row and step of the
chunk, whether the step ran something else than the chunk's action (a
person's command, or an idle while the robot waited for a chunk that fits its
state) and what it executed, in the action space's units (docs/intervention.md).
The runner stores in the episode the action that was executed: the sampled
chunk with those steps replaced (mapped into the module's action space, the
inverse of what the module-to-env connector does), so an off-policy learner
(SAC) learns from what really happened, and flags the step ``intervened`` in
its infos.

On-policy learners (PPO) weigh each step by the ratio of its action's
probability under the current policy to its probability under the policy
that acted (the stored ``action_logp``). The executed action was not drawn
from that policy, but the policy's distribution for that observation is known
(the stored ``action_dist_inputs``), so the behaviour log-probability is
recomputed for the executed action: the ratio then stays exact, and PPO's
clipping bounds the update an unlikely correction can cause. Leaving the step
out of the loss was the alternative; it would also drop the corrections, the
very steps the person wanted learnt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.server_messages import describe

INTERVENED = "intervened"  # the infos key of every step of a bridge that reports interventions


@dataclass(frozen=True)
class Intervened:
    """One feedback row whose chunk ran something else than the chunk's action on some steps."""

    active: np.ndarray  # bool [H]: the step's action was not the chunk's
    action: np.ndarray  # float64 [H, action_dim]: what each step executed (action space units; NaN: unknown)


def intervention_rows(info: Any, m: int, horizon: int, action_dim: int) -> list[Intervened | None] | None:
    """Per feedback row, what its chunk executed where it was not the chunk's (None: all the chunk's); None
    when the feedback says nothing of interventions. ProtocolError (resync) if it says it unreadably."""
    intervention = info.get("intervention") if isinstance(info, Mapping) else None
    if intervention is None:
        return None
    where = "feedback.data.info.intervention"
    if not isinstance(intervention, Mapping) or "active" not in intervention or "action" not in intervention:
        raise ProtocolError(where, f"must be a map of active and action, got {describe(intervention)}")
    active, action = intervention["active"], intervention["action"]
    if not isinstance(active, np.ndarray) or active.dtype.kind != "b" or active.shape != (m, horizon):
        raise ProtocolError(f"{where}.active", f"must be a bool array [{m}, {horizon}], got {describe(active)}")
    shape = (m, horizon, action_dim)
    if not isinstance(action, np.ndarray) or action.dtype.kind not in "iuf" or action.shape != shape:
        raise ProtocolError(f"{where}.action", f"must be a numeric array {list(shape)}, got {describe(action)}")
    executed = action.astype(np.float64)
    if np.isinf(executed[active]).any():
        raise ProtocolError(f"{where}.action", "an executed action is infinite")
    return [Intervened(active[row].copy(), executed[row]) if active[row].any() else None for row in range(m)]


def executed_action(
    sampled: np.ndarray, intervened: Intervened, to_module: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """The RL step's action as the episode stores it: the sampled chunk (flat ``[H * action_dim]``, in the
    module's space) with the intervened steps replaced by what they executed, mapped by ``to_module`` from the
    action space into the module's. A value the bridge could not know (NaN: an actuator never commanded) keeps
    the sampled one."""
    horizon, width = intervened.action.shape
    steps = np.array(sampled, dtype=np.float64).reshape(horizon, width)
    executed = np.asarray(to_module(intervened.action.reshape(-1)), dtype=np.float64).reshape(horizon, width)
    replace = intervened.active[:, None] & np.isfinite(executed)
    steps[replace] = executed[replace]
    return steps.reshape(-1).astype(np.asarray(sampled).dtype)
