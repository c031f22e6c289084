"""The ``record`` section of the configuration, parsed once into a frozen dataclass.

Recording is off unless ``record.path`` names a folder. The parser reads
through any object with the typed getters of the bridge's parameter
``Section`` (``str``/``float``/``int``/``finish``/``key``; the keys' types,
defaults and ranges are declared with the bridge's other parameters), so
this module stays free of ROS and of the node.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

ImageFormat = Literal["raw", "jpeg", "png"]
Compression = Literal["none", "lz4", "zstd"]


class SectionReader(Protocol):
    """What :func:`parse_record_section` needs of a configuration section (the bridge's ``Section``,
    whose declarations supply each key's default, range and choices)."""

    def key(self, name: str) -> str: ...
    def str(self, name: str) -> str: ...
    def float(self, name: str) -> float: ...
    def int(self, name: str) -> int: ...
    def finish(self) -> None: ...


@dataclass(frozen=True)
class RecordSettings:
    """Where and how a run is recorded. ``path is None``: recording is off."""

    path: Path | None = None
    # Rotation: a new file once the current one holds this many bytes / spans this much message time (None: never).
    # On by default: the writer keeps an open file's index in memory, so a file that grows for hours grows it too.
    max_file_bytes: int | None = 2048 * 1024 * 1024
    max_file_duration_s: float | None = 600.0
    # Memory the queue between the control thread and the writer may hold; beyond it, calls are dropped.
    queue_bytes: int = 256 * 1024 * 1024
    image_format: ImageFormat = "raw"
    jpeg_quality: int = 90
    compression: Compression = "lz4"
    # Chunks are the unit a killed process keeps: a chunk is closed when it holds chunk_bytes or is
    # flush_interval_s old, so at most that much is lost to a SIGKILL.
    chunk_bytes: int = 1024 * 1024
    flush_interval_s: float = 1.0

    @property
    def enabled(self) -> bool:
        return self.path is not None


class RecordConfigError(ValueError):
    """A bad ``record`` value found after the section's own getters (same wording as theirs)."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"{key}: got {value!r}; {allowed}")
        self.key = key


def _mcap_importable() -> bool:
    """Whether the MCAP libraries load (tried, not looked up: a broken install must fail here, at startup)."""
    try:
        importlib.import_module("mcap.writer")
        importlib.import_module("mcap_ros2.writer")
    except ImportError:
        return False
    return True


def parse_record_section(
    section: SectionReader, make_error: Callable[[str, Any, str], Exception] = RecordConfigError
) -> RecordSettings:
    """The ``record`` section as :class:`RecordSettings`.

    A bad value raises the section's own error (its getters check the declared types, ranges and
    choices), or ``make_error(key, value, allowed)`` for the checks made here (the bridge passes its
    ConfigError so every config error reads alike).
    """
    path = section.str("path")
    max_mb = section.float("max_file_mb")
    max_duration = section.float("max_file_duration_s")
    queue_mb = section.float("queue_mb")
    image_format = section.str("image_format")
    jpeg_quality = section.int("jpeg_quality")
    compression = section.str("compression")
    flush_interval = section.float("flush_interval_s")
    section.finish()
    if path and not _mcap_importable():
        raise make_error(
            section.key("path"),
            path,
            "recording needs the mcap libraries (pip install mcap mcap-ros2-support, or plugrl_ros's "
            "requirements); or leave record.path empty",
        )
    if image_format != "raw" and importlib.util.find_spec("cv2") is None:
        raise make_error(
            section.key("image_format"),
            image_format,
            "compressing images needs OpenCV (apt: python3-opencv, pip: opencv-python-headless); or use 'raw'",
        )
    return RecordSettings(
        path=Path(path).expanduser() if path else None,
        max_file_bytes=int(max_mb * 1024 * 1024) or None,
        max_file_duration_s=max_duration or None,
        queue_bytes=int(queue_mb * 1024 * 1024),
        image_format=image_format,  # type: ignore[arg-type]
        jpeg_quality=jpeg_quality,
        compression=compression,  # type: ignore[arg-type]
        flush_interval_s=flush_interval,
    )
