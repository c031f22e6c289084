"""The writer process: a recording's MCAP work, away from the robot's interpreter.

Encoding to ROS 2 messages and writing MCAP is pure Python and heavy (tens
of milliseconds per pair of camera frames); done on a thread of the
bridge, it competes with the control loop for the interpreter lock and made
a 100 Hz loop's wake-ups several milliseconds late (bench/bench_record.py).
So the bridge only forwards each call, serialized with the protocol's own
array codec (no pickle), over a pipe to this process, which writes the
files and reports back one JSON line per event on its stdout:
``{"file": path}``, ``{"written": n}``, ``{"durable": n}``,
``{"failed": message}``, ``{"stopped": true}``.

It runs at a lower scheduling priority (nice 10), so that when it is busy
the robot's threads get the cores first. It ignores SIGINT (a terminal's
Ctrl-C reaches the whole process group) and
finishes its file when its input ends: when the bridge closes the pipe, or
when the bridge dies, even by SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.record.channels import Kind
from plugrl_ros.record.settings import RecordSettings

_LENGTH = struct.Struct("<I")
_NICENESS = 10

# frames from the bridge
ITEM = "item"  # [ITEM, seq, kind, env, t_ns, payload]
BATCH_END = "batch_end"  # [BATCH_END, accepted, dropped, dropped_large]: counts; a chance to close a chunk
SYNC = "sync"  # [SYNC]: close the chunk now and report {"durable": n}


def settings_to_json(settings: RecordSettings) -> str:
    values = asdict(settings)
    values["path"] = str(settings.path)
    return json.dumps(values)


def settings_from_json(text: str) -> RecordSettings:
    values = json.loads(text)
    values["path"] = Path(values["path"])
    return RecordSettings(**values)


def to_wire(kind: Kind, payload: Any) -> Any:
    """A call's payload as the codec can carry it."""
    if kind is Kind.OBSERVATION:
        sent_in, row = payload
        return [sent_in, dict(row.images), dict(row.states), row.text]
    if kind is Kind.STEP:
        chunk_step, commanded, applied, intervention = payload
        return [chunk_step, commanded, applied, None if intervention is None else list(intervention)]
    if kind is Kind.ANSWER:
        return list(payload)
    return payload


def from_wire(kind: Kind, wire: Any) -> Any:
    if kind is Kind.OBSERVATION:
        sent_in, images, states, text = wire
        return sent_in, ObservationRow(images=images, states=states, text=text)
    if kind is Kind.STEP:
        chunk_step, commanded, applied, intervention = wire
        return chunk_step, commanded, applied, None if intervention is None else tuple(intervention)
    if kind in (Kind.ANSWER, Kind.LINK):
        return tuple(wire)
    return wire


def frame(message: list) -> bytes:
    data = codec.packb(message)
    return _LENGTH.pack(len(data)) + data


def _read_exact(stream: IO[bytes], size: int) -> bytes | None:
    data = stream.read(size)
    if len(data) < size:
        return None  # the bridge closed the pipe (or died): the end of the run
    return data


def serve(settings: RecordSettings, stem: str, stdin: IO[bytes], report: Any) -> int:
    """Write what arrives on ``stdin`` until it ends; 0 when the file was finished, 1 when writing failed."""
    from plugrl_ros.record.writer import RunWriter  # mcap: only the writing process needs it

    writer = RunWriter(settings, stem, on_open=lambda path: report({"file": str(path)}))
    last_chunk_close = time.monotonic()
    try:
        writer.open_first()
        while True:
            head = _read_exact(stdin, _LENGTH.size)
            body = _read_exact(stdin, _LENGTH.unpack(head)[0]) if head is not None else None
            if body is None:
                break
            message = codec.unpackb(body)
            op = message[0]
            if op == ITEM:
                _, seq, kind_value, env, t_ns, wire = message
                kind = Kind(kind_value)
                writer.write(kind, env, t_ns, seq, from_wire(kind, wire))
            elif op == BATCH_END:
                writer.counts(*message[1:4])
                writer.report_drops(final=False)
                now = time.monotonic()
                if now - last_chunk_close >= settings.flush_interval_s:
                    writer.close_chunk()
                    last_chunk_close = now
                    report({"written": writer.written, "durable": writer.written})
                else:
                    writer.flush()
                    report({"written": writer.written})
            elif op == SYNC:
                writer.close_chunk()
                last_chunk_close = time.monotonic()
                report({"durable": writer.written})
            else:
                raise AssertionError(f"unknown frame {op!r}")
        writer.finish()
    except Exception as exc:  # the writer's boundary: whatever went wrong stops recording, never the robot
        report({"failed": writer.failure(exc)})
        return 1
    report({"written": writer.written})
    report({"stopped": True})
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m plugrl_ros.record.writer_process SETTINGS_JSON STEM``: started by the Recorder, not by hand."""
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bridge decides when the run ends: by closing the pipe
    # A busy writer must yield the cores to the robot's control loop, never the other way round.
    os.nice(_NICENESS)
    settings = settings_from_json(args[0])
    out = sys.stdout
    sys.stdout = sys.stderr  # stdout carries the reports only: a stray print must not break them

    listening = [True]

    def report(event: dict) -> None:
        if not listening[0]:
            return
        try:
            out.write(json.dumps(event) + "\n")
            out.flush()
        except OSError:  # the bridge is gone (killed): nobody to tell, but the file is still to be finished
            listening[0] = False

    return serve(settings, args[1], sys.stdin.buffer, report)


if __name__ == "__main__":
    sys.exit(main())
