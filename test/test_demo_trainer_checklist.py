"""The demo trainer against the server checklist (docs/protocol.md, test/server_checklist.py)."""

from __future__ import annotations

import pytest
from server_checklist import (  # noqa: F401 (the checklist's tests, collected here against this module's port)
    test_a_protocol_error_closes_that_connection_for_a_resync_and_the_server_goes_on,
    test_env_indices_are_connection_scoped,
    test_ragged_batches_unlike_env_sets_and_a_large_frame_are_served,
    test_reuse_is_honoured_after_a_non_terminal_feedback_only,
)

from plugrl_ros.demo.trainer import DemoTrainer, DemoTrainerSettings
from plugrl_ros.tools.serving import TrainerThread

pytestmark = [pytest.mark.websockets]


@pytest.fixture(scope="module")
def port():
    trainer = TrainerThread(DemoTrainer(DemoTrainerSettings(port=0, duration_s=600.0, horizon=3, action_dim=2)))
    yield trainer.start()
    trainer.end()
    assert trainer.join(10.0)
