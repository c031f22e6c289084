"""The last line of defence: a thread that dies of an error nobody expected takes its process down, loudly.

Every way a link can fail is handled where it happens (test_link_faults.py),
so no real fault is left that kills a link thread; the bug here is planted
with a ``sitecustomize`` module in the child's path, which replaces one
method of the real client with one that raises. Everything else is real: the
bridge process, its link thread, a server that completes the handshake,
/diagnostics, the exit status.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from fault_server import FAULTS, Fault, FaultServer
from harness import DIAG_PREFIX, Child, process, python_module, ros_env, wait_until, write_params
from test_link_faults import MODES

from plugrl_ros.thread_guard import EXIT_CRASHED, Crash, guarded

BRIDGE = python_module("plugrl_ros.node.bridge_main")

# the planted bug: "module:Class.method" (or "module:function") raises when called
SITECUSTOMIZE = """\
import importlib, inspect, os
_module, _path = os.environ["PLUGRL_TEST_PLANT_BUG"].split(":")
_owner = importlib.import_module(_module)
*_parents, _name = _path.split(".")
for _parent in _parents:
    _owner = getattr(_owner, _parent)


def _planted(*args, **kwargs):
    raise RuntimeError("planted bug: nobody expected this")


async def _planted_async(*args, **kwargs):
    _planted()


_original = getattr(_owner, _name)
setattr(_owner, _name, _planted_async if inspect.iscoroutinefunction(_original) else _planted)
"""
PLANTS = {
    "train": "plugrl_ros.protocol.client:TrainerClient._serve",
    "deploy": "plugrl_ros.protocol.policy.client:PolicyClient._serve",
}
THREADS = {"train": "trainer link", "deploy": "policy link"}


def planted(tmp_path: Path, where: str) -> dict[str, str]:
    """A child's environment in which ``where`` ("module:attribute") raises an error nobody expected."""
    (tmp_path / "plant").mkdir()
    (tmp_path / "plant" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = ros_env(PLUGRL_TEST_PLANT_BUG=where)
    env["PYTHONPATH"] = f"{tmp_path / 'plant'}:{env.get('PYTHONPATH', '')}"
    return env


async def _hold_open(reader, writer, metadata):
    await reader.read(1 << 16)  # the 101 went out: keep the connection until the client goes
    writer.close()


def test_guarded_hands_what_escapes_a_thread_to_on_crash_with_its_traceback():
    crashes: list[Crash] = []

    def body() -> None:
        raise KeyError("no such thing")

    thread = threading.Thread(target=guarded(body, "test", crashes.append))
    thread.start()
    thread.join(10)
    (crash,) = crashes
    assert crash.thread == "test" and crash.error == "KeyError: 'no such thing'"
    assert "Traceback (most recent call last)" in crash.traceback and "in body" in crash.traceback
    assert f"exits with {EXIT_CRASHED}" in crash.message() and crash.traceback.strip() in crash.message()


def test_a_crash_that_its_report_cannot_handle_still_reaches_stderr(capfd):
    def body() -> None:
        raise ValueError("first")

    def failing_report(crash: Crash) -> None:
        raise OSError("the log is gone")

    thread = threading.Thread(target=guarded(body, "test", failing_report))
    thread.start()
    thread.join(10)
    err = capfd.readouterr().err
    assert "the test thread died of an unexpected error (ValueError: first)" in err and "the log is gone" in err


@pytest.mark.ros
@pytest.mark.websockets
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_link_thread_that_dies_ends_the_bridge_with_an_error_its_traceback_and_exit_70(
    tmp_path: Path, mode: str, robot
):
    params, metadata = MODES[mode]
    env = planted(tmp_path, PLANTS[mode])
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    # the connection that meets the bug opens only once the bridge's status reaches this node
    with FaultServer(metadata, [FAULTS[0]]) as server:
        path = write_params(tmp_path / "bridge.yaml", params(server.uri))
        child: Child
        with process([*BRIDGE, "--ros-args", "--params-file", str(path)], env=env) as child:
            wait_until(lambda: len(diagnostics) or child.proc.poll() is not None, 60, "the bridge's /diagnostics")
            server.faults = [Fault("hold open", _hold_open)]
            code = child.wait(60)
            output = child.output()
    assert code == EXIT_CRASHED, output
    assert "[ERROR] [" in output and f"the {THREADS[mode]} thread died of an unexpected error" in output, output
    assert "Traceback (most recent call last)" in output and "planted bug: nobody expected this" in output, output
    assert output.count("Traceback") == 1, output  # reported once, by the guard, not again by Python

    def crashed() -> list[DiagnosticStatus]:
        return [
            status
            for msg in diagnostics.msgs()
            for status in msg.status
            if status.name == f"{DIAG_PREFIX}: process" and status.level == DiagnosticStatus.ERROR
        ]

    # the bridge waited for the status to be acknowledged before it exited; this node may still be handing it on
    try:
        wait_until(crashed, 10, "the crash on /diagnostics")
    except AssertionError:
        pytest.fail(f"no crash status on /diagnostics; the last ones: {[m.status for m in diagnostics.msgs()][-2:]}")
    assert "planted bug" in crashed()[-1].message, crashed()[-1]


@pytest.mark.ros
@pytest.mark.timeout(120)
def test_a_recorder_thread_that_dies_ends_the_bridge_with_an_error_its_traceback_and_exit_70(tmp_path: Path):
    """The recorder's forwarding thread meets the bug with the first call it hands on (the run's config)."""
    env = planted(tmp_path, "plugrl_ros.record.writer_process:to_wire")
    params, _ = MODES["train"]
    with FaultServer(b"", [FAULTS[0]]) as server:
        config = {**params(server.uri), "record": {"path": str(tmp_path / "recordings")}}
        path = write_params(tmp_path / "bridge.yaml", config)
        with process([*BRIDGE, "--ros-args", "--params-file", str(path)], env=env) as child:
            code = child.wait(60)
            output = child.output()
    assert code == EXIT_CRASHED, output
    assert "the recorder (plugrl-recorder) thread died of an unexpected error" in output, output
    assert "Traceback (most recent call last)" in output and "planted bug: nobody expected this" in output, output
    assert "recording stopped" in output, output  # the recording says why it ended, too
