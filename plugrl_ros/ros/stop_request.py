"""A stop asked for by SIGINT/SIGTERM, remembered as well as raised.

The bridge's signal handlers raise (SystemExit before the bridge runs,
KeyboardInterrupt after) to unwind whatever is running. CPython can lose that
exception: one raised while it compiles a module's source (an import with no
cached bytecode, as on the first start after an install) is swallowed, and
the import goes on. So the handlers also record the request here, and the
bridge checks it between its stages and on every executor turn.
"""

from __future__ import annotations

_requests: list[int] = []  # appended to by a signal handler: nothing there may block


def request() -> None:
    _requests.append(1)


def requested() -> bool:
    return bool(_requests)
