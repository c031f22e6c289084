"""When the held feedback goes out: the multi-env scheduling rule, as a pure function.

Messages on one connection alternate infer, feedback, infer, ... so after an
action the next message must be a feedback, and after a feedback an infer.
Sending a feedback therefore commits the connection to an infer, and an
infer needs at least one env that holds no action and has a fresh
observation. The rule below picks the moment so that no env stalls another:

* A feedback that lets some env ask for a new chunk at once (a non-terminal
  row, or an idle env ready to observe) goes out immediately.
* A feedback of terminal rows only, while other envs are still running their
  chunks and nobody could infer, is held: sending it would leave the
  connection waiting for a resetting robot, and every running env would
  freeze at the end of its chunk until that reset finished. Held, it rides
  along with the next running env's feedback - at most one chunk later -
  while its robot resets in parallel.
* Envs whose last step is in flight are waited for, briefly, so that envs
  stepping together share one exchange instead of queueing one behind the
  other (what makes lockstep throughput scale with envs).
* A trainer that steps every env of the connection together (a synchronous
  vector env, whose metadata's advisory ``vector_autoreset`` says so: it
  needs every robot's next observation before it can return a step) gets one
  feedback for every env's chunk, once each has run and each env that ended
  its episode has been reset, so the infer that follows can ask for every env
  at once.
* Nothing is held past the feedback deadline, well inside the trainer's 60 s
  feedback timeout; if no chunk has ended by then, running chunks are cut.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from plugrl_ros.rollout.env_rollout import EnvRollout


class Decision(enum.Enum):
    SEND = "send"  # send every pending feedback now
    HOLD = "hold"  # wait
    CUT = "cut"  # the deadline passed and nothing is pending: cut running chunks


@dataclass(frozen=True)
class Timing:
    now: float
    action_received_at: float  # when the action this feedback answers arrived
    first_pending_at: float  # when the oldest pending chunk ended
    deadline_s: float
    batch_window_s: float


def decide_feedback(
    envs: Sequence[EnvRollout],
    could_infer: bool,
    paused: bool,
    timing: Timing,
    together: bool = False,
    resets_awaited: bool = False,
) -> Decision:
    """Whether the pending feedback should go out now.

    ``could_infer``: some env that holds no action (or will hold none once the
    pending feedback is sent) has a fresh observation and may join an infer.
    ``together``: the trainer steps every env together; ``resets_awaited``: a
    terminal row's env has no observation of its next episode yet.
    """
    pending = [e for e in envs if e.pending is not None]
    overdue = timing.now - timing.action_received_at >= timing.deadline_s
    if not pending:
        return Decision.CUT if overdue else Decision.HOLD
    if overdue or paused:
        return Decision.SEND
    running = [e for e in envs if e.chunk is not None]
    if together and (running or resets_awaited):
        return Decision.HOLD  # every env's chunk, and the next episode of every env that ended, in one exchange
    if not running:
        return Decision.SEND
    if any(e.on_last_step for e in running) and timing.now - timing.first_pending_at < timing.batch_window_s:
        return Decision.HOLD
    if could_infer or any(not e.pending.ends_episode for e in pending):  # type: ignore[union-attr]
        return Decision.SEND
    return Decision.HOLD
