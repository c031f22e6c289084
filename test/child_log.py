"""A child process's output file that the parent can read while the child writes.

The child inherits the file's descriptor and with it the file offset. Reading with ``seek(0)``
and ``read()`` moves that offset under the child, whose next line then overwrites the start of the
file (a bridge's startup line vanished this way). ``os.pread`` reads at an offset of its own.
"""

from __future__ import annotations

import os
import tempfile


class ChildLog:
    """Pass :attr:`file` as the child's stdout; :meth:`text` is everything written so far."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()

    def text(self) -> str:
        fd = self.file.fileno()
        chunks: list[bytes] = []
        offset = 0
        while chunk := os.pread(fd, 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks).decode(errors="replace")
