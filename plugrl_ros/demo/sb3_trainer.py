"""``plugrl-demo --trainer sb3``'s trainer: Stable-Baselines3's PPO (the default) or SAC through the vector env.

Stable-Baselines3 and torch (the optional ``sb3`` extra) are imported only when the trainer is made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plugrl_ros.tools.serving import TrainerThread


def sb3_trainer(
    algorithm: str, config: Path, envs: int, duration_s: float, seed: int, model_path: Path
) -> TrainerThread[Any]:
    """SB3's ``algorithm`` (PPO or SAC) training the ``envs`` robots that ``config`` describes; the trained
    model is saved to ``model_path``."""
    from plugrl_ros.sb3.demo import SB3DemoTrainer

    trainer = SB3DemoTrainer(algorithm, config, envs, duration_s, seed, model_path)
    return TrainerThread(trainer, name=f"plugrl-demo-sb3-{algorithm.lower()}")
