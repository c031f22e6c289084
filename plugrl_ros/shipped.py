"""Where the package's shipped data files (config/, launch/) are, however it was installed."""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = "plugrl_ros"


def share_candidates() -> list[Path]:
    """Share directories to search, most specific first.

    An ament install (colcon, or ``pip install .`` with AMENT_PREFIX_PATH set)
    has ``share/plugrl_ros``; a source checkout (``pip install -e .``, which
    installs no data files) has ``config/`` next to the Python package.
    """
    candidates = []
    try:
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory

        try:
            candidates.append(Path(get_package_share_directory(PACKAGE)))
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    candidates.append(Path(__file__).resolve().parent.parent)
    candidates.append(Path(sys.prefix) / "share" / PACKAGE)
    return candidates


def shipped_file(kind: str, name: str) -> Path:
    """The path of ``<kind>/<name>`` (e.g. ``config/probe.yaml``); FileNotFoundError says where it looked."""
    looked = []
    for share in share_candidates():
        path = share / kind / name
        if path.is_file():
            return path
        looked.append(str(path))
    raise FileNotFoundError(f"{kind}/{name} of {PACKAGE} not found; looked in: {', '.join(looked)}")
