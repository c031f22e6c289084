"""Benchmark of the PlugRL codec against the memcpy floor and a plain msgpack + numpy baseline.

Run: ``.venv/bin/python bench/bench_codec.py [--repeat R] [--min-time S] [--quick]``. Prints a Markdown table.

The message is an ``infer`` whose observation holds two 224x224x3 uint8 images and a 14-dim float64
state per env, batched for n envs. The floor is the cost of copying the payload bytes once into a
preallocated buffer: no codec can produce a fresh frame faster than that. The baseline is what a
straightforward codec does (openpi's ``msgpack_numpy``): ``tobytes()`` inside a msgpack default hook,
and ``np.frombuffer`` inside an object hook.

Frames of this size are at glibc's malloc thresholds: whether freed memory stays in the heap or goes
back to the kernel (to be page-faulted in again on the next frame) depends on the process's history,
and can change a number several-fold. The cases are therefore interleaved and the median reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plugrl_ros.protocol import codec

ENV_COUNTS = (1, 4, 16)
TARGET_FLOOR_RATIO = 3.0


def infer_message(n: int) -> dict:
    """An infer of n envs: two camera images, one joint state, a prompt each."""
    rng = np.random.default_rng(n)
    return {
        "message_type": "infer",
        "data": {
            "images": {
                "base": rng.integers(0, 256, size=(n, 224, 224, 3), dtype=np.uint8),
                "wrist": rng.integers(0, 256, size=(n, 224, 224, 3), dtype=np.uint8),
            },
            "states": {"joints": rng.standard_normal((n, 14))},
            "text": np.array(["pick up the red block"] * n),
        },
        "env_indices": np.arange(n, dtype="<i8"),
        "step_ids": np.zeros(n, dtype="<i8"),
    }


def payload_bytes(obj: Any) -> int:
    """The number of array data bytes in a message: what every codec must move at least once."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    return 0


def _baseline_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def _baseline_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        return np.frombuffer(obj[b"data"], dtype=np.dtype(obj[b"dtype"])).reshape(obj[b"shape"])
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


def baseline_packb(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_baseline_default, use_bin_type=True)


def baseline_unpackb(frame: bytes) -> Any:
    return msgpack.unpackb(frame, object_hook=_baseline_hook, raw=False, strict_map_key=False)


def calls_per_run(func: Callable[[], Any], min_time: float) -> int:
    """How many calls make one timed run last at least ``min_time`` seconds."""
    timer = timeit.Timer(func)
    number, _ = timer.autorange()
    one_call = max(timer.timeit(number) / number, 1e-9)
    return max(1, int(min_time / one_call))


def median_seconds(cases: dict[str, Callable[[], Any]], repeat: int, min_time: float) -> dict[str, float]:
    """Median time of one call of each case, over ``repeat`` rounds.

    The cases are interleaved (one run of each per round), so that a burst of
    load from a neighbour on the shared cores hits every case alike instead of
    skewing a ratio.
    """
    timers = {name: timeit.Timer(func) for name, func in cases.items()}
    numbers = {name: calls_per_run(func, min_time) for name, func in cases.items()}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, timer in timers.items():
            samples[name].append(timer.timeit(numbers[name]) / numbers[name])
    return {name: statistics.median(times) for name, times in samples.items()}


def measure(n: int, repeat: int, min_time: float) -> dict[str, float]:
    message = infer_message(n)
    frame = codec.packb(message)
    assert frame == baseline_packb(message), "our bytes must equal the baseline's (openpi's) bytes"
    nbytes = payload_bytes(message)
    src = np.frombuffer(np.random.default_rng(0).bytes(nbytes), dtype=np.uint8)
    dst = np.empty_like(src)
    cases = {
        "floor": lambda: np.copyto(dst, src),
        "enc": lambda: codec.packb(message),
        "enc_base": lambda: baseline_packb(message),
        "dec": lambda: codec.unpackb(frame),
        "dec_base": lambda: baseline_unpackb(frame),
    }
    return {"n": n, "payload": nbytes, "frame": len(frame), **median_seconds(cases, repeat, min_time)}


def table(rows: list[dict[str, float]]) -> str:
    head = (
        "| n | payload MB | floor µs (MB/s) | encode µs (MB/s) | baseline enc µs | enc/floor | enc/base "
        "| decode µs (MB/s) | baseline dec µs | dec/floor | dec/base |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        mb = r["payload"] / 1e6

        def cell(seconds: float, mb: float = mb) -> str:
            return f"{seconds * 1e6:,.0f} ({mb / seconds:,.0f})"

        lines.append(
            f"| {r['n']} | {mb:.2f} | {cell(r['floor'])} | {cell(r['enc'])} | {r['enc_base'] * 1e6:,.0f} "
            f"| {r['enc'] / r['floor']:.2f} | {r['enc'] / r['enc_base']:.2f} "
            f"| {cell(r['dec'])} | {r['dec_base'] * 1e6:,.0f} | {r['dec'] / r['floor']:.2f} "
            f"| {r['dec'] / r['dec_base']:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="rounds of runs; the median is reported")
    parser.add_argument("--min-time", type=float, default=0.02, help="seconds each run lasts at least")
    parser.add_argument("--quick", action="store_true", help="one env count, one round: only checks that it runs")
    args = parser.parse_args()
    if args.quick:
        rows = [measure(1, 1, 0.001)]
    else:
        rows = [measure(n, args.repeat, args.min_time) for n in ENV_COUNTS]
    print(table(rows))
    missed = [
        f"n={r['n']} {what}"
        for r in rows
        for what, ours, base in (("encode", r["enc"], r["enc_base"]), ("decode", r["dec"], r["dec_base"]))
        if ours > TARGET_FLOOR_RATIO * r["floor"] or ours > base
    ]
    print()
    print(f"targets (within {TARGET_FLOOR_RATIO:g}x the floor, not slower than the baseline):", end=" ")
    print("met" if not missed else "missed for " + ", ".join(missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
