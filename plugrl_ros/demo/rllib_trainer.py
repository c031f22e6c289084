"""``plugrl-demo --trainer rllib``'s trainer: RLlib PPO (the default) or SAC through a PlugRL EnvRunner.

Ray and torch (the optional ``rllib`` extra) are imported only when the trainer is made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plugrl_ros.tools.serving import TrainerThread

ALGORITHMS = ("PPO", "SAC")  # PPO: on-policy, the robots wait while it learns; SAC: off-policy, they keep acting


def rllib_trainer(
    algorithm: str, config: Path, duration_s: float, seed: int, checkpoint: Path, demonstrations: Path | None = None
) -> TrainerThread[Any]:
    """RLlib's ``algorithm`` (one of :data:`ALGORITHMS`) training the robots that ``config`` describes; its last
    checkpoint goes to ``checkpoint``. ``demonstrations`` (SAC): a folder ``plugrl-export --to rllib`` wrote,
    a quarter of every batch drawn from it."""
    from plugrl_ros.rllib.demo import RLlibDemoTrainer, demo_config, start_ray
    from plugrl_ros.rllib.demo_sac import sac_demo_config

    start_ray()  # here, on the caller's (main) thread, not the trainer's

    build = {"PPO": demo_config, "SAC": sac_demo_config}[algorithm]

    def make_config() -> Any:
        built = build(config, port=0, seed=seed)
        if demonstrations is not None:
            from plugrl_ros.rllib.demonstrations import with_demonstrations

            built = built.callbacks(on_algorithm_init=with_demonstrations([demonstrations], share=0.25))
        return built

    return TrainerThread(
        RLlibDemoTrainer(make_config, duration_s, checkpoint), name=f"plugrl-demo-rllib-{algorithm.lower()}"
    )
