"""PlugRLEnvRunner against the server checklist (docs/protocol.md), as the demo trainer is held to it.

The checklist's tests (test/server_checklist.py, on real websockets) against a
runner whose ``sample()`` a thread calls over and over, as an algorithm does: answering inside
``sample()``, and on its serving thread through updates (``serve_during_updates``).
"""

from __future__ import annotations

import sys
import threading

import pytest

pytest.importorskip("ray.rllib")

from server_checklist import (  # noqa: F401 (the checklist's tests, collected here against this module's port)
    test_a_protocol_error_closes_that_connection_for_a_resync_and_the_server_goes_on,
    test_env_indices_are_connection_scoped,
    test_ragged_batches_unlike_env_sets_and_a_large_frame_are_served,
    test_reuse_is_honoured_after_a_non_terminal_feedback_only,
)

pytestmark = [pytest.mark.rllib, pytest.mark.websockets]


@pytest.fixture(scope="module", params=[False, True], ids=["answering-in-sample", "serving-during-updates"])
def port(request):
    from rllib_client import make_runner

    interval = sys.getswitchinterval()  # a serving runner lowers it for its process: this one is the tests' too
    runner = make_runner(horizon=3, sample_wait_s=0.5, serve_during_updates=request.param)
    done = threading.Event()

    def algorithm() -> None:
        while not done.is_set():
            runner.sample(num_timesteps=50)

    thread = threading.Thread(target=algorithm, daemon=True)
    thread.start()
    yield runner.port
    done.set()
    thread.join(10.0)
    runner.stop()
    sys.setswitchinterval(interval)
