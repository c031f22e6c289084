"""Benchmark of what recording costs the control thread, against a no-op call and a copy of the frames.

Run: ``.venv/bin/python bench/bench_record.py [--repeat R] [--min-time S] [--quick] [--json PATH]``.
Prints two Markdown tables.

Per-call cost on the calling thread of each :class:`Recorder` method with a
two-camera 640x480 observation plus a 14-dim state, against two baselines
measured in the same run: a no-op Python method taking the same arguments
(the floor of any call), and a memcpy of the two frames into a preallocated
buffer (what any recorder that copies the observation would pay). The
writer is either parked (its stream blocks: pure queueing cost; once the
budget is full, the drop path) or live, writing to a stream that discards
the bytes (the control thread then also competes with the writer for the
GIL, as it does on a robot). The second table is the writer's own
throughput: observations per second it turns into MCAP. The third is a
100 Hz loop on its own thread recording every tick, against the same loop
with recording off: how late its wake-ups come (p50, p99, max), with the
MCAP work on a thread of the same process (the first design) and in the
writer process the Recorder uses.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import fmt_ratio, fmt_us, interleaved_medians, md_table, median, percentile, save_json
from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.record.recorder import Recorder
from plugrl_ros.record.settings import RecordSettings
from plugrl_ros.record.writer import exclusive_open


class NullStream(io.RawIOBase):
    """Counts and discards: the disk is not what this benchmark measures."""

    def __init__(self) -> None:
        self.position = 0
        self.gate = threading.Event()
        self.gate.set()
        self.refuse = False

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.gate.wait()
        if self.refuse:  # the measurement is over: fail the recorder, which then discards its queue
            raise OSError("benchmark over")
        self.position += len(data)
        return len(data)

    def tell(self) -> int:
        return self.position


class NoOp:
    """The floor: a method call with the recorder's arguments that does nothing."""

    def observation(self, env, t_ns, row, sent_in) -> None:
        pass


def observation() -> ObservationRow:
    rng = np.random.default_rng(0)
    return ObservationRow(
        images={
            "base": rng.integers(0, 256, (480, 640, 3), dtype=np.uint8),
            "wrist": rng.integers(0, 256, (480, 640, 3), dtype=np.uint8),
        },
        states={"joints": rng.standard_normal(14)},
    )


def recorder(
    tmp: Path, queue_mb: float, compression: str = "lz4", image_format: str = "raw"
) -> tuple[Recorder, NullStream]:
    stream = NullStream()
    settings = RecordSettings(
        path=tmp,
        queue_bytes=int(queue_mb * 1024 * 1024),
        compression=compression,  # type: ignore[arg-type]
        image_format=image_format,  # type: ignore[arg-type]
    )
    rec = Recorder(settings, opener=lambda path: stream)
    rec.start()
    return rec, stream


def call_costs(tmp: Path, repeat: int, min_time: float) -> tuple[list[list], list[dict]]:
    row = observation()
    frames = row.images["base"].nbytes * 2
    floor_buffer = np.empty(frames, dtype=np.uint8)
    base, wrist = row.images["base"].reshape(-1), row.images["wrist"].reshape(-1)

    def memcpy() -> None:
        floor_buffer[: base.size] = base
        floor_buffer[base.size :] = wrist

    noop = NoOp()
    # parked with room: every call is queued (the budget is far beyond what the run adds)
    parked, parked_stream = recorder(tmp / "parked", queue_mb=1e9)
    parked_stream.gate.clear()
    # parked and full: every call is dropped
    full, full_stream = recorder(tmp / "full", queue_mb=1.0)
    full_stream.gate.clear()
    action = np.zeros((50, 7), dtype=np.float32)
    commanded = {"arm": np.zeros(6), "gripper": np.zeros(1)}
    t = iter(range(10**12))
    baselines = {
        "no-op call (floor)": lambda: noop.observation(0, next(t), row, "infer"),
        "memcpy of the 2 frames": memcpy,
    }
    parked_cases = {
        **baselines,
        "observation, queued": lambda: parked.observation(0, next(t), row, "infer"),
        "observation, dropped (queue full)": lambda: full.observation(0, next(t), row, "infer"),
        "chunk 50x7, queued": lambda: parked.chunk(0, next(t), action),
        "step, 2 sinks, queued": lambda: parked.step(0, next(t), 3, commanded),
        "step_result, queued": lambda: parked.step_result(0, next(t), 1.0, False, False, False),
    }
    rows: list[list] = []
    saved: list[dict] = []

    def add(writer: str, medians: dict[str, float]) -> None:
        floor, copy = medians["no-op call (floor)"], medians["memcpy of the 2 frames"]
        for name, s in medians.items():
            rows.append([writer, name, fmt_us(s), fmt_ratio(s / floor), fmt_ratio(s / copy)])
            saved.append({"writer": writer, "case": name, "us": s * 1e6, "x_noop": s / floor, "x_memcpy": s / copy})

    add("parked", interleaved_medians(parked_cases, repeat, min_time))
    for stream in (parked_stream, full_stream):
        stream.refuse = True  # a parked queue can hold thousands of frames: discard, do not write them
        stream.gate.set()
    for rec in (parked, full):
        rec.close(timeout_s=600)
    # The writer busy turning frames into MCAP: the calling thread now competes with it for the GIL,
    # so the baselines are measured again under the same load.
    live, _ = recorder(tmp / "live", queue_mb=256.0)
    live_cases = {**baselines, "observation, writer busy": lambda: live.observation(0, next(t), row, "infer")}
    add("busy", interleaved_medians(live_cases, repeat, min_time))
    status = live.status()
    live.close(timeout_s=600)
    rows.append(["busy", f"(the busy writer's queue: {status.accepted} queued, {status.dropped} dropped)", "", "", ""])
    return rows, saved


def writer_throughput(tmp: Path, count: int) -> tuple[list[list], list[dict]]:
    row = observation()
    rows, saved = [], []
    for image_format, compression in (("raw", "none"), ("raw", "lz4"), ("raw", "zstd"), ("jpeg", "none")):
        rec, stream = recorder(tmp / f"w-{image_format}-{compression}", 1e9, compression, image_format)
        stream.gate.clear()  # queue everything first, then time the writer alone
        for i in range(count):
            rec.observation(0, i, row, "infer")
        started = time.perf_counter()
        stream.gate.set()
        assert rec.sync(600.0)
        elapsed = time.perf_counter() - started
        rec.close()
        per_s = count / elapsed
        mb_in = row.images["base"].nbytes * 2 / 1e6
        rows.append(
            [
                image_format,
                compression,
                f"{per_s:,.1f}",
                f"{per_s * mb_in:,.0f}",
                f"{stream.position / count / 1e6:.2f}",
            ]
        )
        saved.append(
            {"compression": compression, "obs_per_s": per_s, "mb_per_obs_written": stream.position / count / 1e6}
        )
    return rows, saved


class Off:
    """Recording off: the tick makes no recorder calls at all."""

    def observation(self, *args) -> None:
        pass

    def step(self, *args) -> None:
        pass

    def step_result(self, *args) -> None:
        pass


def tick_lateness(tmp: Path, ticks: int, rounds: int, rate_hz: float = 100.0) -> tuple[list[list], list[dict]]:
    """A 100 Hz loop on its own thread, recording one observation, step and result per tick (or not).

    Lateness = wake-up time - the tick's deadline: what the writer's share of the
    interpreter and the cores costs a control loop.
    """
    row = observation()
    commanded = {"arm": np.zeros(6), "gripper": np.zeros(1)}
    period = 1.0 / rate_hz
    never = threading.Event()

    def loop(rec) -> list[float]:
        late: list[float] = []
        deadline = time.perf_counter() + period
        for i in range(ticks):
            never.wait(max(0.0, deadline - time.perf_counter()))  # a timed wait, as a timer's
            now = time.perf_counter()
            late.append(now - deadline)
            t_ns = time.monotonic_ns()
            rec.observation(0, t_ns, row, "infer")
            rec.step(0, t_ns, i % 10, commanded)
            rec.step_result(0, t_ns, 1.0, False, False, False)
            deadline += period
        return late

    labels = {
        "off": "off",
        "thread": "writer thread, raw images",
        "process": "writer process, raw images",
        "process-jpeg": "writer process, JPEG images",
    }
    samples: dict[str, list[dict[str, float]]] = {case: [] for case in labels}
    drops: dict[str, list[float]] = {case: [] for case in labels if case != "off"}
    for r in range(rounds):
        for case, runs in samples.items():
            rec: Any = Off()
            folder = tmp / f"tick-{case}-{r}"
            if case == "thread":  # the first design: MCAP work on a thread of this process, same files
                rec = Recorder(RecordSettings(path=folder), opener=exclusive_open)
                rec.start()
            elif case.startswith("process"):  # the Recorder as the bridge uses it, writing real files
                image_format = "jpeg" if case.endswith("jpeg") else "raw"
                rec = Recorder(RecordSettings(path=folder, image_format=image_format))  # type: ignore[arg-type]
                rec.start()
            result: list[list[float]] = []
            thread = threading.Thread(target=lambda rec=rec, result=result: result.append(loop(rec)))
            thread.start()
            thread.join()
            if case != "off":
                status = rec.status()
                drops[case].append(status.dropped / max(1, status.accepted + status.dropped))
                rec.close(timeout_s=600)
                shutil.rmtree(folder, ignore_errors=True)
            late = result[0]
            runs.append({"p50": percentile(late, 0.5), "p99": percentile(late, 0.99), "max": max(late)})
    rows, saved = [], []
    off_p99 = median([s["p99"] for s in samples["off"]])
    for case, runs in samples.items():
        stats = {k: median([run[k] for run in runs]) for k in ("p50", "p99", "max")}
        dropped = f"{median(drops[case]) * 100:.0f}" if case in drops else "-"
        label = labels[case]
        ms = [f"{stats[k] * 1e3:.2f}" for k in ("p50", "p99", "max")]
        rows.append([label, *ms, fmt_ratio(stats["p99"] / off_p99), dropped])
        saved.append({"recording": case, **stats, "dropped_fraction": median(drops.get(case, [0.0]))})
    return rows, saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="rounds of runs; the median is reported")
    parser.add_argument("--min-time", type=float, default=0.02, help="seconds each run lasts at least")
    parser.add_argument("--writer-count", type=int, default=60, help="observations for the writer throughput")
    parser.add_argument("--ticks", type=int, default=500, help="ticks of the 100 Hz loop per run")
    parser.add_argument("--quick", action="store_true", help="one round, few observations: only checks that it runs")
    parser.add_argument("--json", default=None, help="also save the results here")
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.min_time, args.writer_count, args.ticks = 1, 0.002, 4, 20
    import tempfile

    with tempfile.TemporaryDirectory(prefix="plugrl-bench-record-") as tmp:
        call_rows, call_saved = call_costs(Path(tmp), args.repeat, args.min_time)
        writer_rows, writer_saved = writer_throughput(Path(tmp), args.writer_count)
        tick_rows, tick_saved = tick_lateness(Path(tmp), args.ticks, 1 if args.quick else 3)
    print("Recorder calls on the control thread (2x640x480x3 frames + 14 states), median of interleaved runs\n")
    print(md_table(["writer", "case", "µs per call", "x no-op call", "x memcpy of frames"], call_rows))
    print("\nThe writer thread alone: 2x640x480x3 observations turned into MCAP (bytes discarded)\n")
    print(
        md_table(
            ["images", "chunk compression", "observations/s", "MB/s in", "MB written per observation"], writer_rows
        )
    )
    print(
        f"\nA 100 Hz loop recording a 2x640x480 observation, a step and a result every tick ({args.ticks} ticks, "
        "median of rounds): lateness of its wake-ups\n"
    )
    print(md_table(["recording", "p50 ms", "p99 ms", "max ms", "p99 x off", "calls dropped %"], tick_rows))
    save_json(args.json, "record", {"rows": call_saved, "writer": writer_saved, "ticks": tick_saved})
    return 0


if __name__ == "__main__":
    sys.exit(main())
