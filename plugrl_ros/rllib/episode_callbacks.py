"""RLlib's episode callbacks, made by the PlugRL runner at the points where ``SingleAgentEnvRunner`` makes them.

A user's ``RLlibCallback`` (``config.callbacks(MyCallbacks)``) or callback
functions (``config.callbacks(on_episode_step=...)``) get
``on_episode_created`` before a robot's episode takes its first observation,
``on_episode_start`` once it has (after the env-to-module connectors ran on
it), ``on_episode_step`` after every RL step (a chunk's feedback, after the
connectors), and ``on_episode_end`` on the step that ended it, after that
step's ``on_episode_step``, with the earlier chunks ``sample()`` returned as
``prev_episode_chunks``; all with RLlib's own keyword arguments. Two of them
a remote robot cannot give: ``env`` is None (the env is a robot behind a
bridge, not a ``gym.Env`` here), and ``env_index`` is the robot's index on
its bridge's connection (unique only within that connection; two bridges
both have a robot 0).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ray.rllib.callbacks.utils import make_callback
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.typing import EpisodeID


class EpisodeCallbacks:
    """Makes the ``on_episode_*`` callbacks of one runner."""

    def __init__(
        self,
        env_runner: Any,
        callbacks_objects: Sequence[Any],
        previous_chunks: Mapping[EpisodeID, list[SingleAgentEpisode]],
    ) -> None:
        """``previous_chunks``: the runner's chunks returned earlier, per episode id (read, never written)."""
        self._runner = env_runner
        self._objects = list(callbacks_objects)
        self._previous_chunks = previous_chunks

    def created(self, episode: SingleAgentEpisode, env_index: int) -> None:
        """A robot's new episode, before its first observation is added."""
        self._make("on_episode_created", episode, env_index)

    def started(self, episode: SingleAgentEpisode, env_index: int) -> None:
        """The episode holds its first observation, processed by the env-to-module connectors."""
        self._make("on_episode_start", episode, env_index)

    def stepped(self, episode: SingleAgentEpisode, env_index: int) -> None:
        """The episode took an RL step (a chunk's feedback), processed by the env-to-module connectors."""
        self._make("on_episode_step", episode, env_index)

    def ended(self, episode: SingleAgentEpisode, env_index: int) -> None:
        """The step just added ended the episode (terminated or truncated)."""
        self._make(
            "on_episode_end",
            episode,
            env_index,
            prev_episode_chunks=list(self._previous_chunks.get(episode.id_, [])),
        )

    def _make(self, which: str, episode: SingleAgentEpisode, env_index: int, **more: Any) -> None:
        functions: list[Callable] | Callable | None = getattr(self._runner.config, f"callbacks_{which}")
        make_callback(
            which,
            callbacks_objects=self._objects,
            callbacks_functions=functions,
            kwargs={
                "episode": episode,
                "env_runner": self._runner,
                "metrics_logger": self._runner.metrics,
                "env": None,  # a robot behind a bridge: no gym.Env in this process
                "rl_module": self._runner.module,
                "env_index": env_index,  # the robot's index on its bridge's connection
                **more,
            },
        )
