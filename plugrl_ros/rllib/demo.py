"""``plugrl-demo --trainer rllib``: RLlib PPO trains the demo reachers through the bridge, in this process.

The same robots, bridge config (``config/demo.yaml``), progress line and plot
as the demo trainer; the trainer is RLlib's PPO with a
:class:`~plugrl_ros.rllib.env_runner.PlugRLEnvRunner` as its only EnvRunner
(``num_env_runners=0``: the local runner samples and listens). The config is
what a user writes for their own robot (docs/rllib.md, "The config you write for your robot"), tuned
for this task: one RL step per control step (H = 1), observations flattened
and normalised by RLlib's own connectors, a discount of 0.9 per step. Ray
starts here with the two CPUs a small machine has, and the learner runs on
one thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plugrl_ros.demo.results import EpisodeRecord
from plugrl_ros.demo.trainer import RECENT_EPISODES, TrainerStats

log = logging.getLogger("plugrl_ros.rllib.demo")

HORIZON = 1  # PPO learns this task far faster deciding every step than whole 5-step chunks (docs/rllib.md)
TRAIN_BATCH = 1000  # RL steps per iteration
_END_POLL_S = 0.5


def local_ppo(
    spaces: Any,
    runner: Any,
    *,
    training: dict[str, Any],
    hidden: list[int],
    seed: int,
    sample_timeout_s: float,
    runner_cls: type | None = None,
) -> Any:
    """RLlib PPO whose one EnvRunner is a PlugRL runner in this process (``runner_cls``, by default
    :class:`PlugRLEnvRunner`, with the ``RunnerSettings`` ``runner``), for the robots ``spaces``
    (:func:`robot_spaces`) describe: flattened observations through a ``MeanStdFilter``, PPO's ``training``
    settings, an MLP of ``hidden`` layers."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.connectors.env_to_module import FlattenObservations, MeanStdFilter
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from plugrl_ros.rllib import PlugRLEnvRunner

    return (
        PPOConfig()
        .environment(
            observation_space=spaces.observation_space,
            action_space=spaces.action_space,
            env_config=runner.env_config(),
        )
        .env_runners(
            env_runner_cls=runner_cls or PlugRLEnvRunner,
            num_env_runners=0,
            sample_timeout_s=sample_timeout_s,
            env_to_module_connector=lambda env, spaces, device: [FlattenObservations(), MeanStdFilter()],
        )
        .training(**training)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=hidden))
        .debugging(seed=seed)
    )


def demo_config(params_file: str | Path, *, port: int, seed: int = 0, host: str = "127.0.0.1") -> Any:
    """The PPO config that trains the demo reachers: the example of docs/rllib.md."""
    from plugrl_ros.rllib import RunnerSettings, chunk_gamma, robot_spaces

    # the policy reads the states; the bridge also sends the camera, which the runner ignores
    spaces = robot_spaces(params_file, horizon=HORIZON, images=[], state_dims={"target": 4})
    # no API key: the demo's bridge, started by the same command, does not send one (a PLUGRL_API_KEY
    # exported for a real run must not lock the demo out); docs/security.md for robots elsewhere
    runner = RunnerSettings(host=host, port=port, horizon=HORIZON, sample_wait_s=10.0, api_key_env="")
    training = {
        "gamma": chunk_gamma(0.9, HORIZON),
        "lambda_": 0.95,
        "lr": 2e-3,
        "train_batch_size_per_learner": TRAIN_BATCH,
        "minibatch_size": 250,
        "num_epochs": 15,
        "vf_clip_param": 100.0,
    }
    return local_ppo(spaces, runner, training=training, hidden=[32, 32], seed=seed, sample_timeout_s=30.0)


def start_ray() -> None:
    """Ray for the demo's learner, in this process, sized for a small machine (best on the main thread).

    In a Python started with -S, ``ray.init`` hung in Ray's core worker set-up, holding the interpreter
    lock (its workers, started with -S too, could not import Ray): that is refused here, loudly.
    """
    if sys.flags.no_site:  # Ray would start its workers with -S too, and they could not import Ray
        raise RuntimeError(
            "Ray cannot start here: this Python runs without its site packages (-S), which Ray passes on to its "
            "worker processes; start the learner's process without -S (plugrl_ros.executables.RAY_DRIVERS)"
        )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import ray
    import torch

    torch.set_num_threads(1)  # the learner shares two cores with the robots and the bridge
    if not ray.is_initialized():
        # on the main thread Ray replaces the SIGTERM handler with one that exits at once: the demo's own
        # (stop_request: stop the bridge, the robot and the learner in order) stays
        # (only the main thread may set a handler: elsewhere Ray sets none either)
        main = threading.current_thread() is threading.main_thread()
        ours = signal.getsignal(signal.SIGTERM)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        if main:
            signal.signal(signal.SIGTERM, ours)
    # the terminal shows the progress line: RLlib's notices (new API stack, deprecations) go nowhere
    for name in [n for n in logging.root.manager.loggerDict if n == "ray" or n.startswith("ray.")]:
        logging.getLogger(name).setLevel(logging.ERROR)


class RLlibDemoTrainer:
    """RLlib (PPO or SAC) with a PlugRL runner, as a trainer :class:`~plugrl_ros.tools.serving.TrainerThread` runs.

    The run ends ``duration_s`` after the first bridge connected: the runner
    closes every bridge with ``plugrl-server-stop`` and the iteration under
    way is dropped. Then, with ``checkpoint_dir``, the algorithm is saved
    there (RLlib's ``save_to_path``): :attr:`checkpoint`, for the deploy step.
    """

    def __init__(self, make_config: Callable[[], Any], duration_s: float, checkpoint_dir: Path | None = None) -> None:
        self._make_config = make_config
        self.duration_s = duration_s
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint: Path | None = None  # saved when the run ended, if it trained at all
        self.horizon = HORIZON  # the chunks the runner served (from its action space once built)
        self.algo: Any = None
        self.runner: Any = None
        self.iterations = 0
        self.last_result: dict[str, Any] = {}
        self._over: asyncio.Event | None = None
        self._ended_at: float | None = None
        self._finished = False

    # -- TrainerThread's protocol --------------------------------------------------------

    async def start(self) -> int:
        self._over = asyncio.Event()
        await asyncio.to_thread(self._build)
        return int(self.runner.port)

    async def finished(self) -> list[EpisodeRecord]:
        from plugrl_ros.rllib.env_runner import RunnerStopped

        assert self._over is not None
        timer = asyncio.ensure_future(self._end_after_duration())
        try:
            while not self._over.is_set():
                try:
                    self.last_result = await asyncio.to_thread(self.algo.train)
                except RunnerStopped:
                    break
                self.iterations += 1
                log.info("iteration %d: %s", self.iterations, iteration_line(self.last_result))
        finally:
            timer.cancel()
            self._ended_at = time.monotonic()
            await asyncio.to_thread(self._shutdown)
            self._finished = True
        return self.records()

    def end(self) -> None:
        """End the run now: the bridges get plugrl-server-stop (called on the trainer's event loop)."""
        if self._over is not None and not self._over.is_set():
            self._over.set()
            if self.runner is not None:
                self.runner.stop()

    # -- what the demo shows ------------------------------------------------------------

    def stats(self) -> TrainerStats:
        runner = self.runner
        first = None if runner is None else runner.figures.first_opened_at
        elapsed = 0.0 if first is None else (self._ended_at or time.monotonic()) - first
        episodes = [] if runner is None else list(runner.episode_log)
        recent = [e.ret for e in episodes[-RECENT_EPISODES:]]
        return TrainerStats(
            connected=0 if runner is None else runner.figures.bridges,
            elapsed_s=elapsed,
            chunks=0 if runner is None else runner.figures.answers_sent,
            episodes=len(episodes),
            recent_mean_return=sum(recent) / len(recent) if recent else None,
            updates=self.iterations,
            policy_std=None,
            finished=self._finished,
        )

    def records(self) -> list[EpisodeRecord]:
        if self.runner is None or self.runner.figures.first_opened_at is None:
            return []
        first = self.runner.figures.first_opened_at
        return [EpisodeRecord(e.ended_at - first, e.env, e.ret, e.control_steps) for e in list(self.runner.episode_log)]

    # -- Ray ------------------------------------------------------------------------------

    def _build(self) -> None:
        import ray

        start_ray()  # a no-op where the process's main thread started it, as rllib_trainer does
        self.algo = self._make_config().build_algo()
        self.runner = self.algo.env_runner
        self.horizon = self.runner.chunks.horizon
        log.info(
            "RLlib %s %s built; the runner listens on port %d",
            ray.__version__,
            type(self.algo).__name__,
            self.runner.port,
        )

    def _shutdown(self) -> None:
        import ray

        if self.algo is not None:
            if self.checkpoint_dir is not None and self.iterations > 0:
                self.checkpoint = Path(self.algo.save_to_path(self.checkpoint_dir))
                log.info("saved the trained algorithm to %s", self.checkpoint)
            self.algo.stop()
        ray.shutdown()

    async def _end_after_duration(self) -> None:
        while True:
            await asyncio.sleep(_END_POLL_S)
            first = None if self.runner is None else self.runner.figures.first_opened_at
            if first is not None and time.monotonic() - first >= self.duration_s:
                log.info("the run's %g s are over; ending it", self.duration_s)
                self.end()
                return


def iteration_line(result: dict[str, Any]) -> str:
    """One iteration's figures from RLlib's result: return, steps, where the time went, the link."""
    runners = result.get("env_runners", {})
    link = runners.get("plugrl", {})
    timers = result.get("timers", {})

    def number(value: Any, digits: int = 2) -> str:
        return "-" if value is None else f"{float(value):.{digits}f}"

    return (
        f"return {number(runners.get('episode_return_mean'))}, {runners.get('num_env_steps_sampled', 0)} RL steps, "
        f"sampling {number(timers.get('env_runner_sampling_timer'))} s, "
        f"learning {number(timers.get('learner_update_timer'))} s, "
        f"robots idle {number(link.get('robot_idle_share'))} "
        f"({number(link.get('robot_idle_share_between_samples'))} between samples), "
        f"infer round trip {number(link.get('infer_round_trip_ms'))} ms, "
        f"inference {number(link.get('inference_ms_per_row'), 3)} ms per row"
    )
