"""A connection that fails at any point is a lost connection: the real bridge reconnects, in train and deploy mode.

The bridge runs as a process against :class:`fault_server.FaultServer`, which
breaks each connection in turn before the HTTP 101, right after it (a TCP
reset or a FIN), after the metadata, mid-frame, with a close frame or an
invalid frame. The bridge must come back after every one of them, twice
round the list, and never print a traceback. No robot is needed: a link
connects whether or not its robots publish, and every fault here comes
before the first request.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_server import AFTER_101, FAULTS, FaultServer
from harness import RATE_HZ, bridge, wait_until

from plugrl_ros.protocol import codec

pytestmark = [pytest.mark.ros, pytest.mark.websockets, pytest.mark.timeout(180)]

FAST_RECONNECT = {"reconnect_initial_s": 0.05, "reconnect_max_s": 0.2, "tcp_timeout_s": 20.0}
ROBOT = {
    "control": {"rate_hz": RATE_HZ},
    "status": {"diagnostics_period_s": 0.2, "log_period_s": 1.0},
    "observations": {"states": {"pos": {"topic": "state", "type": "std_msgs/Float64MultiArray"}}},
    "actions": {"arm": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 2], "idle": "zero"}},
}


def train_params(uri: str) -> dict:
    return {**ROBOT, "trainer": {"uri": uri, **FAST_RECONNECT}}


def deploy_params(uri: str) -> dict:
    policy = {
        "uri": uri,
        **FAST_RECONNECT,
        "observations": {"observation": {"state": "states.pos"}},
        "action_horizon": 4,
        "action_dim": 2,
    }
    return {**ROBOT, "mode": "deploy", "policy": policy}


MODES = {
    "train": (train_params, codec.packb({"message_type": "metadata", "data": {}})),
    "deploy": (deploy_params, codec.packb({"action_horizon": 4, "action_dim": 2})),
}
# what the bridge logs when an open connection is lost (train: any after the 101; deploy: any after the 101 too)
LOST = {"train": "trainer connection closed", "deploy": "policy server connection lost"}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_bridge_reconnects_after_every_kind_of_broken_connection(tmp_path: Path, mode: str):
    params, metadata = MODES[mode]
    rounds = 2
    with FaultServer(metadata) as server, bridge(tmp_path, params(server.uri)) as child:
        wanted = rounds * len(FAULTS) + 1  # every fault twice, and a connection after the last one
        try:
            wait_until(lambda: server.count() >= wanted or child.proc.poll() is not None, 60, f"{wanted} connections")
        finally:
            seen = list(server.seen)
        assert child.proc.poll() is None, f"the bridge exited with {child.proc.returncode}\n{child.output()}"
        assert len(seen) >= wanted, f"the bridge stopped reconnecting after: {seen}\n{child.output()}"
        assert seen[: len(FAULTS)] == [f.name for f in FAULTS]
    output = child.output()
    assert "Traceback" not in output, output
    # the faults after the 101 were open connections that the bridge saw lost, not failed handshakes
    after_101 = sum(name in AFTER_101 for name in seen[: rounds * len(FAULTS)])
    assert output.count(LOST[mode]) >= after_101, output
