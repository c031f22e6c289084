"""Training runs that survive a restart: an RLlib checkpoint every N iterations, and a resume from the latest.

Everything is RLlib's own checkpointing: ``algo.save_to_path()`` writes the
learner (RLModule, optimizer), the runner's state (its connectors, such as a
``MeanStdFilter``'s statistics, and its sampled-steps count;
:meth:`PlugRLEnvRunner.get_state`), RLlib's metrics and the iteration count;
``algo.restore_from_path()`` reads them back into an algorithm built from
the same config. What this module adds is the driver loop's bookkeeping: a
numbered folder per checkpoint, written under a temporary name and renamed
when complete (a driver killed while saving leaves no half checkpoint that
looks whole), the last ``keep`` kept, and the latest found again on restart.

A robot's episode in flight is not in a checkpoint: a driver that dies closes
its bridges' connections, the protocol forgets them, and the bridges start
fresh episodes when they reconnect to the restarted driver.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from plugrl_ros.rllib.checkpoint_policy import CHECKPOINT_INFO

log = logging.getLogger("plugrl_ros.rllib.checkpoints")

PREFIX = "checkpoint_"
_NAME = re.compile(rf"{PREFIX}(\d+)")
_PARTIAL = ".partial"


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The complete checkpoint of the highest iteration under ``folder`` (None if there is none)."""
    found = []
    for path in Path(folder).glob(f"{PREFIX}*"):
        match = _NAME.fullmatch(path.name)
        if match and (path / CHECKPOINT_INFO).is_file():
            found.append((int(match.group(1)), path))
    return max(found)[1] if found else None


class CheckpointedTraining:
    """``train()`` that saves a checkpoint every ``every`` iterations into ``folder``, keeping the last ``keep``."""

    def __init__(self, algo: Any, folder: str | Path, every: int = 1, keep: int = 3) -> None:
        if every < 1 or keep < 1:
            raise ValueError(f"every ({every}) and keep ({keep}) must be at least 1")
        self.algo = algo
        self.folder = Path(folder)
        self.every = every
        self.keep = keep
        self.resumed_from: Path | None = None

    @classmethod
    def resume_or_build(cls, config: Any, folder: str | Path, every: int = 1, keep: int = 3) -> CheckpointedTraining:
        """Build the algorithm from ``config`` and restore the latest checkpoint in ``folder``, if any."""
        training = cls(config.build_algo(), folder, every, keep)
        training.resume()
        return training

    def resume(self) -> Path | None:
        """Restore the latest checkpoint in the folder into the algorithm, if there is one; its path."""
        latest = latest_checkpoint(self.folder)
        if latest is not None:
            self.algo.restore_from_path(latest)
            self.resumed_from = latest
            log.info("resumed from %s (iteration %d)", latest, self.algo.training_iteration)
        return latest

    def train(self) -> dict[str, Any]:
        """One ``algo.train()``; then a checkpoint if the iteration is a multiple of ``every``."""
        result = self.algo.train()
        if self.algo.training_iteration % self.every == 0:
            self.save()
        return result

    def save(self) -> Path:
        """A checkpoint of the algorithm as it is now; its folder (complete once it has this name)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / f"{PREFIX}{self.algo.training_iteration:06d}"
        partial = final.with_name(final.name + _PARTIAL)
        if partial.exists():  # a save that a killed driver left unfinished
            shutil.rmtree(partial)
        self.algo.save_to_path(partial)
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        self._prune()
        return final

    def _prune(self) -> None:
        numbered = sorted(
            (int(m.group(1)), path)
            for path in self.folder.glob(f"{PREFIX}*")
            if (m := _NAME.fullmatch(path.name)) is not None
        )
        for _, path in numbered[: -self.keep]:
            shutil.rmtree(path)
