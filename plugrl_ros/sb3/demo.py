"""``plugrl-demo --trainer sb3``: Stable-Baselines3's PPO or SAC trains the demo reachers through the bridge.

The model trains on :class:`~plugrl_ros.sb3.RobotVecEnv` as on any SB3 env:
``SAC("MultiInputPolicy", env)``, ``model.learn(...)``. The run ends
``duration_s`` after the first bridge connected (a callback returns False),
the model is saved (``model.save``: what ``plugrl-policy-server --sb3``
serves in the deploy step), and closing the env ends the bridges' run
(``plugrl-server-stop``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from plugrl_ros.demo.results import EpisodeRecord
from plugrl_ros.demo.trainer import RECENT_EPISODES, TrainerStats
from plugrl_ros.protocol.server_auth import ServerAccess
from plugrl_ros.vector import VectorSettings

log = logging.getLogger("plugrl_ros.sb3.demo")

ALGORITHMS = ("PPO", "SAC")
GAMMA = 0.9  # the demo's discount per step (its episodes last at most 60 steps)
EPISODE_LOG_LENGTH = 10_000
FIGURES_EVERY_S = 10.0  # the trainer's log shows the robots' idle share this often


def model_settings(algorithm: str, seed: int) -> dict[str, Any]:
    """The demo's settings of ``algorithm``: small networks, the demo's discount, on one CPU."""
    common: dict[str, Any] = {"gamma": GAMMA, "seed": seed, "device": "cpu", "verbose": 0}
    if algorithm == "SAC":
        return {**common, "learning_starts": 500, "batch_size": 256, "policy_kwargs": {"net_arch": [64, 64]}}
    return {**common, "n_steps": 256, "batch_size": 128, "n_epochs": 10, "policy_kwargs": {"net_arch": [64, 64]}}


class SB3DemoTrainer:
    """SB3's ``algorithm`` on the robots that ``config`` describes, as a trainer :class:`TrainerThread` runs."""

    def __init__(self, algorithm: str, config: Path, envs: int, duration_s: float, seed: int, model_path: Path) -> None:
        self.algorithm = algorithm
        self.config = config
        self.envs = envs
        self.duration_s = duration_s
        self.seed = seed
        self.model_path = model_path
        self.horizon = 1
        self.checkpoint: Path | None = None  # the saved model, once the run has trained
        self.env: Any = None
        self.model: Any = None
        self.episode_log: deque[EpisodeRecord] = deque(maxlen=EPISODE_LOG_LENGTH)
        self._stop = threading.Event()
        self._first_at: float | None = None
        self._ended_at: float | None = None
        self._finished = False
        self._steps = 0
        self._figures_at = time.monotonic()

    # -- TrainerThread's protocol --------------------------------------------------------

    async def start(self) -> int:
        await asyncio.to_thread(self._build)
        return int(self.env.port)

    async def finished(self) -> list[EpisodeRecord]:
        try:
            await asyncio.to_thread(self._learn)
        finally:
            self._ended_at = time.monotonic()
            await asyncio.to_thread(self._shutdown)
            self._finished = True
        return list(self.episode_log)

    def end(self) -> None:
        """End the run now (from any thread): learning stops at its next step, then the bridges get the stop."""
        self._stop.set()

    # -- what the demo shows ------------------------------------------------------------

    def stats(self) -> TrainerStats:
        figures = None if self.env is None else self.env.env.figures
        elapsed = 0.0 if self._first_at is None else (self._ended_at or time.monotonic()) - self._first_at
        recent = [e.ret for e in list(self.episode_log)[-RECENT_EPISODES:]]
        return TrainerStats(
            connected=0 if figures is None else figures.bridges,
            elapsed_s=elapsed,
            chunks=0 if figures is None else figures.answers_sent,
            episodes=len(self.episode_log),
            recent_mean_return=sum(recent) / len(recent) if recent else None,
            updates=0 if self.model is None else int(getattr(self.model, "_n_updates", 0)),
            policy_std=None,
            finished=self._finished,
        )

    def records(self) -> list[EpisodeRecord]:
        return list(self.episode_log)

    # -- SB3 ------------------------------------------------------------------------------

    def _build(self) -> None:
        import stable_baselines3
        import torch

        from plugrl_ros.sb3 import RobotVecEnv

        torch.set_num_threads(1)  # the learner shares two cores with the robots and the bridge
        # no API key: the demo's bridge, started by the same command, does not send one
        settings = VectorSettings(port=0, access=ServerAccess(api_key_env=""), algorithm=f"SB3 {self.algorithm}")
        # the policy reads the states; the bridge also sends the camera, which the env does not declare
        self.env = RobotVecEnv.from_params(self.config, self.envs, settings, images=[], state_dims={"target": 4})
        algorithm = getattr(stable_baselines3, self.algorithm)
        self.model = algorithm("MultiInputPolicy", self.env, **model_settings(self.algorithm, self.seed))
        log.info(
            "Stable-Baselines3 %s %s built; the vector env listens on port %d",
            stable_baselines3.__version__,
            self.algorithm,
            self.env.port,
        )

    def _learn(self) -> None:
        from stable_baselines3.common.callbacks import BaseCallback

        trainer = self

        class Progress(BaseCallback):
            """Logs the robots' episodes for the demo's plot, and ends learning when the run is over."""

            def _on_step(self) -> bool:
                now = time.monotonic()
                if trainer._first_at is None:
                    trainer._first_at = now
                for env, info in enumerate(self.locals.get("infos", [])):
                    episode = info.get("episode")
                    if episode is not None:
                        record = EpisodeRecord(now - trainer._first_at, env, float(episode["r"]), int(episode["l"]))
                        trainer.episode_log.append(record)
                trainer._steps += 1
                if now - trainer._figures_at >= FIGURES_EVERY_S:
                    trainer._figures_at = now
                    trainer._log_figures()
                return not trainer._stop.is_set() and now - trainer._first_at < trainer.duration_s

        self.model.learn(total_timesteps=10**9, callback=Progress(), progress_bar=False)
        log.info("the run's %g s are over after %d steps of %d robots", self.duration_s, self._steps, self.env.num_envs)

    def _log_figures(self) -> None:
        """The link's figures since the last call: how much of their time the robots waited for SB3."""
        figures = self.env.env.link_figures()
        idle = "-" if figures.idle_share is None else f"{100 * figures.idle_share:.0f} %"
        trip = "-" if figures.round_trip_ms is None else f"{figures.round_trip_ms:.1f} ms"
        log.info(
            "%d steps of %d robots; robots idle %s of their time (waiting for SB3's actions and updates); "
            "infer round trip %s",
            self._steps,
            self.env.num_envs,
            idle,
            trip,
        )

    def _shutdown(self) -> None:
        if self.model is not None and self._steps > 0:
            self.model.save(self.model_path)
            self.checkpoint = self.model_path
            log.info("saved the trained model to %s", self.model_path)
        if self.env is not None:
            self.env.close()
