"""A process that records the synthetic run and waits to be killed: the SIGKILL test's victim.

Prints the file and the writer process's id, plays the first half of the
calls, makes sure they are on disk (``sync``),
prints ``SYNCED <calls>``, plays the rest (which stay in the chunk being
built: the chunk size and flush interval are huge), prints ``MORE`` and
waits on stdin for a kill that never lets it finish the file.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_scenario import play, scenario

from plugrl_ros.record.recorder import Recorder
from plugrl_ros.record.settings import RecordSettings


def main() -> int:
    folder = Path(sys.argv[1])
    calls = scenario()
    half = len(calls) // 2
    recorder = Recorder(RecordSettings(path=folder, chunk_bytes=64 * 1024 * 1024, flush_interval_s=3600.0))
    print(f"FILE {recorder.start()}", flush=True)
    print(f"WRITER {recorder.writer_pid}", flush=True)
    play(recorder, calls[:half])
    if not recorder.sync(60.0):
        print("SYNC FAILED", flush=True)
        return 1
    print(f"SYNCED {half}", flush=True)
    play(recorder, calls[half:])
    print("MORE", flush=True)
    sys.stdin.readline()  # killed while waiting here
    return 0


if __name__ == "__main__":
    sys.exit(main())
