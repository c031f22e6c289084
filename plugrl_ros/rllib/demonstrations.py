"""Demonstrations in an off-policy learner's replay: a share of every batch drawn from recorded episodes.

SAC (and any algorithm that samples its train batches from an
``EpisodeReplayBuffer``) learns from what the robots do. Seeded with a
person's demonstrations (``plugrl-export --to rllib``), it also learns from
what the person did: this buffer keeps them apart from the robots' episodes,
never evicts them, and draws ``demonstration_share`` of every batch from them
(the rest, as usual, uniformly from the robots' own), so the demonstrations
keep their weight however long the run. SAC accepts only RLlib's own buffer
types in its config, so the buffer goes in once the algorithm is built, by
an ``on_algorithm_init`` callback (the config's replay buffer must be
RLlib's uniform ``EpisodeReplayBuffer``; its settings are kept)::

    from plugrl_ros.rllib.demonstrations import with_demonstrations

    config.training(replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 100_000})
    config.callbacks(on_algorithm_init=with_demonstrations(["/data/demos"], share=0.25))

The demonstrations must have been exported with the runner's spaces (the
same params file, states, images and H) and its action normalisation
(``plugrl-export``'s default is RLlib's, ``normalize_actions``). They are read
again from their folders when a run is restored from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer


def read_episodes(folders: Sequence[str | Path]) -> list[SingleAgentEpisode]:
    """The episodes ``plugrl-export --to rllib`` (or RLlib's own recording) wrote under ``folders``."""
    import msgpack
    import msgpack_numpy
    import pyarrow.parquet as pq

    episodes = []
    for folder in folders:
        files = sorted(Path(folder).glob("*.parquet"))
        if not files:
            raise ValueError(f"demonstrations: {folder} holds no .parquet files (plugrl-export --to rllib writes them)")
        for path in files:
            for item in pq.read_table(path, columns=["item"]).column("item").to_pylist():
                state = msgpack.unpackb(item, object_hook=msgpack_numpy.decode)
                episodes.append(SingleAgentEpisode.from_state(state))
    return episodes


def flattened(episode: SingleAgentEpisode) -> SingleAgentEpisode:
    """``episode`` with its observations flattened as RLlib's ``FlattenObservations`` flattens them: a runner's
    episodes hold what its env-to-module pipeline wrote back, and under that connector it is the flat vector."""
    from ray.rllib.utils.numpy import flatten_inputs_to_1d_tensor
    from ray.rllib.utils.spaces.space_utils import get_base_struct_from_space

    struct = get_base_struct_from_space(episode.observation_space)
    observations = [
        np.asarray(flatten_inputs_to_1d_tensor(o, spaces_struct=struct, batch_axis=False), dtype=np.float32)
        for o in episode.get_observations()
    ]
    return SingleAgentEpisode(
        id_=episode.id_,
        observations=observations,
        actions=list(episode.get_actions()),
        rewards=list(episode.get_rewards()),
        infos=list(episode.get_infos()),
        terminated=episode.is_terminated,
        truncated=episode.is_truncated,
        action_space=episode.action_space,
        len_lookback_buffer=0,
    )


class DemonstrationEpisodeReplayBuffer(EpisodeReplayBuffer):
    """RLlib's uniform episode replay, with ``demonstration_share`` of every sample drawn from demonstrations.

    ``flatten_observations``: the demonstrations' observations as ``FlattenObservations`` gives them (the
    runner's episodes hold them so under that connector, as the demo's SAC config uses); False for an
    env-to-module pipeline without it, which leaves the runner's episodes the observation space's dicts."""

    def __init__(
        self,
        capacity: int = 10000,
        *,
        demonstrations: Sequence[str | Path] | str = (),
        demonstration_share: float = 0.25,
        flatten_observations: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(capacity, **kwargs)
        if not 0.0 <= demonstration_share < 1.0:
            raise ValueError(f"demonstration_share: {demonstration_share} must be at least 0 and below 1")
        folders = [demonstrations] if isinstance(demonstrations, (str, Path)) else list(demonstrations)
        episodes = read_episodes(folders) if folders else []
        if flatten_observations:
            episodes = [flattened(e) for e in episodes]
        steps = sum(len(e) for e in episodes)
        # a buffer of their own, as large as they are: never evicted by the robots' episodes
        self.demonstrations = EpisodeReplayBuffer(max(steps, 1), **kwargs)
        if episodes:
            self.demonstrations.add(episodes)
        self.demonstration_share = demonstration_share if steps else 0.0
        self.demonstration_steps = steps

    def sample(self, num_items: int | None = None, **kwargs: Any) -> Any:
        """``num_items`` transitions: ``round(demonstration_share * num_items)`` of them from the demonstrations."""
        if not self.demonstration_share or not num_items:
            return super().sample(num_items, **kwargs)
        if not kwargs.get("sample_episodes"):
            raise ValueError("DemonstrationEpisodeReplayBuffer samples episodes (sample_episodes=True), as SAC does")
        from_demonstrations = round(self.demonstration_share * num_items)
        own = super().sample(num_items - from_demonstrations, **kwargs) if num_items > from_demonstrations else []
        return [*own, *self.demonstrations.sample(from_demonstrations, **kwargs)]


def with_demonstrations(
    folders: Sequence[str | Path], share: float = 0.25, flatten_observations: bool = True
) -> Callable[..., None]:
    """An ``on_algorithm_init`` callback that gives the algorithm a :class:`DemonstrationEpisodeReplayBuffer`
    holding the episodes under ``folders``, ``share`` of every batch drawn from them."""
    folders = [str(f) for f in folders]
    read_episodes(folders)  # a wrong folder fails where the config is written, not after the algorithm is built

    def on_algorithm_init(*, algorithm: Any, **kwargs: Any) -> None:
        buffer = getattr(algorithm, "local_replay_buffer", None)
        if type(buffer) is not EpisodeReplayBuffer:
            raise ValueError(
                "with_demonstrations: the algorithm's replay buffer must be RLlib's EpisodeReplayBuffer "
                f"(replay_buffer_config type 'EpisodeReplayBuffer'), not {type(buffer).__name__}"
            )
        settings = {k: v for k, v in algorithm.config.replay_buffer_config.items() if k != "type"}
        algorithm.local_replay_buffer = DemonstrationEpisodeReplayBuffer(
            **settings, demonstrations=folders, demonstration_share=share, flatten_observations=flatten_observations
        )

    return on_algorithm_init
