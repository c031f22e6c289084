"""Reading a recording back: decoded messages in the order they were recorded, from complete or cut-off files.

A recorder killed mid-run leaves a file without its summary and footer,
and perhaps a half-written chunk at the end. The reader streams records
from the start (it never needs the summary), checks each chunk's CRC, and
stops at the first record it cannot read: everything up to the last
complete chunk comes back, and :attr:`RecordingReader.problem` says where
and why the rest is missing.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from mcap.exceptions import McapError
from mcap.records import Channel, Footer, Message, Schema
from mcap.stream_reader import StreamReader
from mcap_ros2.decoder import DecoderFactory

from plugrl_ros.record import schemas

# how the recorder names its files: the run's start (UTC), a suffix if another run started that second, the part
_RECORDER_NAME = re.compile(r"(plugrl_.+)_(\d+)\.mcap")

# What reading a cut-off file raises once short reads are refused (below): the end of the data, a
# record too short to parse, a chunk whose CRC does not match.
_CUT_OFF: tuple[type[BaseException], ...] = (McapError, EOFError, ValueError, struct.error)


class _WholeReads:
    """A file whose reads return all the bytes asked for or raise EOFError.

    The mcap stream reader takes a short read at face value: a chunk cut off
    by a crash would reach the decompressor half-written. Refusing short
    reads turns every cut-off record into one clear end of data.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream

    def read(self, size: int) -> bytes:
        data = self._stream.read(size)
        if len(data) != size:
            raise EOFError(f"{size - len(data)} byte(s) missing at the end of the file")
        return data


@dataclass(frozen=True)
class Recorded:
    """One decoded message."""

    topic: str
    schema: str
    log_time: int
    sequence: int
    msg: Any


class RecordingReader:
    """Iterate over one MCAP file's messages in file order (which is the order the recorder was called in)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.complete = False  # the file ends with its footer (the recorder finished it)
        self.problem = ""  # why reading stopped early, if it did

    def __iter__(self) -> Iterator[Recorded]:
        schemas_by_id: dict[int, Schema] = {}
        channels: dict[int, Channel] = {}
        decoders: dict[int, Any] = {}
        factory = DecoderFactory()
        with open(self.path, "rb") as stream:
            records = StreamReader(_WholeReads(stream), validate_crcs=True).records
            while True:
                try:
                    record = next(records)
                except StopIteration:
                    break
                except _CUT_OFF as exc:
                    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                    self.problem = (
                        f"the file ends early at byte {stream.tell()} ({why}); "
                        "everything up to its last complete chunk was read (the recorder was probably killed)"
                    )
                    return
                if isinstance(record, Schema):
                    schemas_by_id[record.id] = record
                elif isinstance(record, Channel):
                    channels[record.id] = record
                elif isinstance(record, Footer):
                    self.complete = True
                elif isinstance(record, Message):
                    channel = channels[record.channel_id]
                    decode = decoders.get(record.channel_id)
                    schema = schemas_by_id[channel.schema_id]
                    if decode is None:
                        decode = decoders[record.channel_id] = factory.decoder_for(channel.message_encoding, schema)
                    yield Recorded(channel.topic, schema.name, record.log_time, record.sequence, decode(record.data))


def in_written_order(paths: Sequence[Path]) -> list[Path]:
    """The files of recordings in the order the recorder wrote them, when all are named as it names them
    (``plugrl_<start>_<part>.mcap``): by folder, start, then part as a number, so ``_10`` follows ``_9``
    where a shell's ``*.mcap`` puts it after ``_1``. Files named otherwise keep the order given."""
    parts = [_RECORDER_NAME.fullmatch(path.name) for path in paths]
    if not paths or not all(parts):
        return list(paths)
    return [path for _, path in sorted(zip(parts, paths), key=lambda p: (str(p[1].parent), p[0][1], int(p[0][2])))]


def read_all(paths: Sequence[Path]) -> Iterator[tuple[RecordingReader, Recorded]]:
    """Every message of several files (the parts of a rotated run, in order)."""
    for path in paths:
        reader = RecordingReader(path)
        for recorded in reader:
            yield reader, recorded


# -- turning decoded messages back into values ---------------------------------


def array(msg: Any) -> np.ndarray:
    """A Float64MultiArray as the array it was recorded from (shape from its layout)."""
    shape = [d.size for d in msg.layout.dim]
    return np.asarray(msg.data, dtype=np.float64).reshape(shape)


def labelled(msg: Any) -> dict[str, float]:
    """A fields record (one dimension labelled ``a,b,c``) as ``{a: .., b: .., c: ..}``."""
    names = msg.layout.dim[0].label.split(",")
    return dict(zip(names, (float(v) for v in msg.data)))


def values(msg: Any) -> dict[str, Any]:
    """A DiagnosticStatus's values, JSON-decoded where they were written as JSON."""
    out: dict[str, Any] = {}
    for pair in msg.values:
        try:
            out[pair.key] = json.loads(pair.value)
        except json.JSONDecodeError:
            out[pair.key] = pair.value
    return out


def image(recorded: Recorded) -> np.ndarray:
    """An Image or CompressedImage as uint8 [h, w, c] (RGB, RGBA or mono, as the bridge sent it)."""
    msg = recorded.msg
    if recorded.schema == schemas.IMAGE:
        channels_in = {"mono8": 1, "rgb8": 3, "rgba8": 4}[msg.encoding]
        data = np.frombuffer(bytes(msg.data), dtype=np.uint8)
        rows = data.reshape(msg.height, msg.step)[:, : msg.width * channels_in]
        return rows.reshape(msg.height, msg.width, channels_in)
    import cv2  # only compressed recordings need it

    decoded = cv2.imdecode(np.frombuffer(bytes(msg.data), dtype=np.uint8), cv2.IMREAD_UNCHANGED)
    if decoded is None:
        raise ValueError(f"{recorded.topic}: cannot decode a {msg.format!r} image")
    if decoded.ndim == 2:
        return decoded[:, :, None]
    code = cv2.COLOR_BGR2RGB if decoded.shape[2] == 3 else cv2.COLOR_BGRA2RGBA
    return cv2.cvtColor(decoded, code)
