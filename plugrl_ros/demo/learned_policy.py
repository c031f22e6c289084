"""What the demo's deploy step serves: the demo learner's linear policy, the RLlib run's checkpoint or the SB3 model.

Either way a policy server speaking openpi's contract serves it and the same
bridge config, in ``mode: deploy``, drives the robots:
``plugrl-test-policy-server --linear policy.npz`` for the demo trainer,
``plugrl-policy-server --rllib CHECKPOINT --config demo.yaml`` for RLlib,
whatever its algorithm (the server needs only the checkpoint), and
``plugrl-policy-server --sb3 MODEL.zip --config demo.yaml`` for Stable-Baselines3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugrl_ros import executables
from plugrl_ros.demo.results import write_policy

# The learned policy.npz reads the states concatenated in name order: the request keys config/demo.yaml's
# policy section sends them as.
POLICY_STATE_KEYS = "state/joints,state/target"


@dataclass(frozen=True)
class LearnedPolicy:
    """A policy the run learned, where it is, and the policy server command that serves it."""

    name: str  # what the summary calls the file or folder
    path: str
    horizon: int  # H of the chunks the server answers with
    server: str  # the executable, for the terminal
    command: list[str]

    @property
    def execution(self) -> str:
        """How the deploy-mode bridge runs its chunks (``policy.execution.mode``).

        A chunk of one step is for the tick its observation was taken: any
        latency makes it late, and asynchronous execution drops a late step.
        The robot then waits for each action (``sync``), as it did in training.
        """
        return "sync" if self.horizon == 1 else "switch"


def policy_server_command(policy: str, horizon: int) -> list[str]:
    """``plugrl-test-policy-server`` serving the learned linear policy on a free port."""
    return executables.command(
        "plugrl_ros.tools.test_policy_server",
        *("--port", "0", "--linear", policy, "--horizon", str(horizon)),
        *("--action-dim", "2", "--stamp-key", POLICY_STATE_KEYS),
    )


def learned_policy(trainer: Any, output: Path, config: Path, horizon: int) -> LearnedPolicy | None:
    """What ``trainer`` (stopped) learned, ready to serve; None if it left nothing to deploy.

    The demo trainer's learner is written as ``policy.npz``; an RLlib trainer
    has saved its checkpoint (``checkpoint``, with its chunk's ``horizon``).
    """
    learner = getattr(trainer, "learner", None)
    if learner is not None:
        path = write_policy(output, learner)
        if path is None:
            return None
        command = policy_server_command(path, horizon)
        return LearnedPolicy("policy.npz", path, horizon, "plugrl-test-policy-server --linear", command)
    checkpoint = getattr(trainer, "checkpoint", None)
    if checkpoint is not None:
        path = str(checkpoint)
        backend = "--sb3" if path.endswith(".zip") else "--rllib"  # an SB3 model file, or an RLlib checkpoint folder
        command = executables.command(
            "plugrl_ros.tools.policy_server", backend, path, "--config", str(config), "--port", "0"
        )
        name = "model" if backend == "--sb3" else "checkpoint"
        return LearnedPolicy(name, path, trainer.horizon, f"plugrl-policy-server {backend}", command)
    return None
