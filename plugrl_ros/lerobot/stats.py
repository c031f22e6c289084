"""LeRobot's statistics of a feature (``meta/stats.json``, and per episode in ``meta/episodes``): min, max, mean,
std, count and the quantiles LeRobot's normalisers read, per element (per channel for images, in [0, 1])."""

from __future__ import annotations

import numpy as np

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)  # LeRobot's q01, q10, q50, q90, q99
# an episode's image statistics come from this many frames at most, evenly spaced (LeRobot samples too): the
# statistics of every pixel of a long recording would hold it all in memory at once
IMAGE_SAMPLES = 100


def vector_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """Statistics of ``values`` [N, d] (or [N]: shape (1,) each), over the frames."""
    data = np.asarray(values, dtype=np.float64)
    data = data.reshape(len(data), -1)
    return _stats(data, axis=0, count=len(data))


def image_stats(images: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel statistics of ``images`` [N, h, w, c] uint8, scaled to [0, 1], each of shape (c, 1, 1) as
    LeRobot keeps them (its images are channel-first)."""
    picked = np.unique(np.linspace(0, len(images) - 1, min(len(images), IMAGE_SAMPLES)).round().astype(int))
    data = np.asarray(images[picked], dtype=np.float64) / 255.0
    pixels = data.reshape(-1, data.shape[-1])
    return {k: v if k == "count" else v.reshape(-1, 1, 1) for k, v in _stats(pixels, 0, len(images)).items()}


def aggregate(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The statistics of several episodes together, from each one's, as LeRobot aggregates them: exact min, max,
    mean and std (pooled variance), quantiles weighted by the episodes' frame counts."""
    counts = np.array([float(p["count"][0]) for p in parts])
    weights = counts / counts.sum()

    def weighted(key: str) -> np.ndarray:
        return sum(w * np.asarray(p[key], dtype=np.float64) for w, p in zip(weights, parts))

    mean = weighted("mean")
    second = sum(w * (np.asarray(p["std"]) ** 2 + np.asarray(p["mean"]) ** 2) for w, p in zip(weights, parts))
    out = {
        "min": np.min([p["min"] for p in parts], axis=0),
        "max": np.max([p["max"] for p in parts], axis=0),
        "mean": mean,
        "std": np.sqrt(np.maximum(second - mean**2, 0.0)),
        "count": np.array([int(counts.sum())], dtype=np.int64),
    }
    for key in parts[0]:
        if key.startswith("q"):
            out[key] = weighted(key)
    return out


def _stats(data: np.ndarray, axis: int, count: int) -> dict[str, np.ndarray]:
    out = {
        "min": data.min(axis=axis),
        "max": data.max(axis=axis),
        "mean": data.mean(axis=axis),
        "std": data.std(axis=axis),
        "count": np.array([count], dtype=np.int64),
    }
    for q, value in zip(QUANTILES, np.quantile(data, QUANTILES, axis=axis)):
        out[f"q{round(q * 100):02d}"] = value
    return out
