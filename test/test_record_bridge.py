"""The bridge records a real run: probe robot and bridge as ROS processes, the test trainer keeping a transcript.

The recording is read back with the mcap reader and compared, transition by
transition, with what the test trainer received and sent (its transcript) and
with what the actuators' subscribers received.
"""

from __future__ import annotations

import os
import signal
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from harness import Child, Robot, TrainerThread, free_port, statuses, wait_until
from std_msgs.msg import Float64MultiArray
from test_faults import probe_bridge_command, probe_robot, shown, trainer_settings, wait_for_actuators

from plugrl_ros.record.read import array, labelled, read_all, values

pytestmark = [pytest.mark.ros, pytest.mark.websockets, pytest.mark.slow, pytest.mark.timeout(180)]

N_ENVS = 3


def recorded_run(tmp_path: Path, mode: str) -> tuple[list, list, list[list[np.ndarray]], str]:
    """A probe run (resync, then stop) recorded into ``tmp_path``: (transcript, records, commands heard, output)."""
    port = free_port()
    settings = trainer_settings(port=port, script=("resync", "stop"), n_envs=N_ENVS, keep_transcript=True, horizon=4)
    trainer = TrainerThread(settings)
    listener = Robot()
    try:
        heard = [listener.listen(Float64MultiArray, f"/probe{i}/action") for i in range(N_ENVS)]
        command = probe_bridge_command(f"ws://127.0.0.1:{port}", N_ENVS, mode=mode, rate=50.0)
        command += ["-p", f"record.path:={tmp_path}"]
        with probe_robot(N_ENVS), shown(Child(command), "bridge") as bridge:
            # the listener hears every command only once matched; the trainer starts after that
            wait_for_actuators(listener, N_ENVS)
            trainer.start()
            code = bridge.wait(90)
            output = bridge.output()
        report = trainer.report(30)
        assert code == 0, output
        assert report.failed == 0 and not report.incomplete, report.text() + output
        commands = [[np.asarray(m.data, dtype=np.float64) for m in inbox.msgs()] for inbox in heard]
    finally:
        listener.close()
    files = sorted(tmp_path.glob("*.mcap"))
    assert len(files) == 1, files
    records = []
    readers = []
    for reader, recorded in read_all(files):
        records.append(recorded)
        readers.append(reader)
    assert readers and readers[-1].complete, readers[-1].problem if readers else "empty"
    return list(report.transcript), records, commands, output


def by_connection(records: list) -> list[tuple[int, object]]:
    """Each record with the number (1, 2, ...) of the trainer connection open when it was recorded."""
    connection, out = 0, []
    for rec in records:
        if rec.topic == "/plugrl/link/event" and rec.msg.message == "connect":
            connection += 1
        out.append((connection, rec))
    return out


def env_of(topic: str) -> int | None:
    parts = topic.split("/")
    return int(parts[2].removeprefix("env")) if len(parts) > 3 and parts[2].startswith("env") else None


def assert_prefix(got: list, sent: list, what: str, tail: int) -> None:
    """The trainer received what was recorded as sent, except at most ``tail`` records sent as the link closed
    (after the trainer's last action it closes: the bridge's feedback and next infer reach no one)."""
    assert got[: len(sent)] == sent, f"{what} differ"
    assert 0 <= len(got) - len(sent) <= tail, f"{what}: {len(got)} recorded, {len(sent)} received"


@pytest.mark.parametrize("mode", ["lockstep", "timer"])
def test_a_recorded_probe_run_holds_what_the_trainer_saw_and_sent_and_what_the_actuators_got(tmp_path, mode):
    transcript, records, commands, _ = recorded_run(tmp_path, mode)
    tagged = by_connection(records)
    connections = sorted({entry.connection for entry in transcript})
    assert connections == [1, 2], connections  # the resync, then the run to its stop
    assert max(c for c, _ in tagged) == 2

    # -- observations: what the trainer received, env by env in order (infers and feedbacks), per connection.
    # An infer after a non-terminal feedback carries that feedback's row again: the recorder records it once,
    # with the feedback (readers take the feedback's observation for such an infer).
    sent: dict[tuple, list] = defaultdict(list)
    for entry in transcript:
        states = entry.observation["states"]
        rows = iter(range(states["t"].shape[0]))
        for k, env in enumerate(entry.env_indices):
            if entry.reuse is not None and entry.reuse[k]:
                continue
            row = next(rows)
            observed = (entry.kind, float(states["t"][row, 0]), tuple(states["a"][row]))
            seen = sent[(entry.connection, env)]
            if entry.kind == "infer" and seen and seen[-1][0] == "feedback" and seen[-1][1:] == observed[1:]:
                continue
            seen.append(observed)
    got: dict[tuple, list] = defaultdict(list)
    t_of: dict[tuple, float] = {}
    for connection, rec in tagged:
        parts = rec.topic.split("/")  # /plugrl/env<i>/<infer|feedback>/states/<name>
        if len(parts) == 6 and parts[3] in ("infer", "feedback") and parts[4] == "states":
            key = (connection, env_of(rec.topic))
            if parts[5] == "t":
                t_of[key] = float(array(rec.msg)[0])
            else:
                got[key].append((parts[3], t_of.pop(key), tuple(array(rec.msg))))
    assert len(sent) == 2 * N_ENVS
    for key, observations in sent.items():
        assert_prefix(got[key], observations, f"connection {key[0]} env {key[1]} observations", tail=2)

    # -- chunks: what the trainer sent (one per infer), each env's slice
    chunks_sent: dict[tuple, list] = defaultdict(list)
    for entry in transcript:
        if entry.kind == "infer":
            for row, env in enumerate(entry.env_indices):
                chunks_sent[(entry.connection, env)].append(entry.action[:, row].astype(np.float64).tolist())
    chunks_got: dict[tuple, list] = defaultdict(list)
    for connection, rec in tagged:
        if rec.topic.endswith("/action_chunk"):
            chunks_got[(connection, env_of(rec.topic))].append(array(rec.msg).tolist())
    for key, chunks in chunks_sent.items():
        # the bridge may not have received the last chunk before the close: it went with the connection
        got_chunks = chunks_got[key]
        assert got_chunks == chunks[: len(got_chunks)] and len(chunks) - len(got_chunks) in (0, 1), key

    # -- reward sums: the step results recorded since each chunk arrived add up to its feedback's reward
    fed_back: dict[tuple, list] = defaultdict(list)
    for entry in transcript:
        if entry.kind == "feedback":
            for k, env in enumerate(entry.env_indices):
                fed_back[(entry.connection, env)].append(float(entry.rewards[k]))
    sums: dict[tuple, list] = defaultdict(list)
    running: dict[int, float] = defaultdict(float)
    for connection, rec in tagged:
        env = env_of(rec.topic)
        if env is None:
            continue
        kind = rec.topic.split("/")[3]
        if kind == "action_chunk":
            running[env] = 0.0
        elif kind == "step_result":
            running[env] += labelled(rec.msg)["reward"]
        elif kind == "feedback" and rec.topic.endswith("/t"):
            sums[(connection, env)].append(round(running[env], 9))
    assert fed_back
    for key, rewards in fed_back.items():
        assert_prefix(
            sums[key], [round(r, 9) for r in rewards], f"connection {key[0]} env {key[1]} reward sums", tail=1
        )

    # -- the resync's close dropped chunks, and the recording says which
    closes = [values(rec.msg) for rec in records if rec.topic == "/plugrl/link/event" and rec.msg.message == "close"]
    assert any(c.get("dropped_envs") for c in closes), closes

    # -- what the actuators' subscribers received is what was recorded as commanded, in order
    for env in range(N_ENVS):
        commanded = [array(rec.msg).tolist() for rec in records if rec.topic.startswith(f"/plugrl/env{env}/command/")]
        heard = [c.tolist() for c in commands[env]]
        assert commanded, f"env {env}: no command recorded"
        # shutdown's idle commands (none for the probe: idle none) come after the last recorded step
        # a command published before DDS matched the test's subscriber is lost (seen with the Jazzy wheels)
        skip = next((i for i in range(len(commanded)) if commanded[i:] == heard[: len(commanded) - i]), None)
        assert skip is not None and skip <= 3, f"env {env}: commands differ (or more than 3 missed)"


def writer_process_of(bridge_pid: int) -> int:
    """The recorder's writer process: the bridge's one child running plugrl_ros.record.writer_process."""
    children = []
    for task in Path(f"/proc/{bridge_pid}/task").iterdir():
        children += [int(pid) for pid in (task / "children").read_text().split()]
    writers = [pid for pid in children if b"writer_process" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(writers) == 1, children
    return writers[0]


def test_a_stopped_writer_drops_records_counted_on_diagnostics_while_the_robot_keeps_stepping(tmp_path):
    """SIGSTOP the writer process: the queue fills, records are dropped and counted; the robot steps on."""
    port = free_port()
    settings = trainer_settings(port=port, script=("stop",), n_envs=2, feedbacks_per_connection=100_000)
    trainer = TrainerThread(settings)
    listener = Robot()
    recording: list[dict[str, str]] = []

    def on_diagnostics(msg: DiagnosticArray) -> None:
        for name, (_, _, values_) in statuses(msg).items():
            if name.endswith(": recording"):
                recording.append(values_)

    try:
        listener.listen(DiagnosticArray, "/diagnostics", on_diagnostics)
        heard = [listener.listen(Float64MultiArray, f"/probe{i}/action") for i in range(2)]
        command = probe_bridge_command(f"ws://127.0.0.1:{port}", 2, mode="timer", rate=50.0)
        command += ["-p", f"record.path:={tmp_path}", "-p", "record.queue_mb:=0.05"]
        with probe_robot(2), shown(Child(command), "bridge") as bridge:
            wait_for_actuators(listener, 2)
            trainer.start()
            wait_until(lambda: all(len(inbox) >= 20 for inbox in heard), 60, "both robots stepping")
            writer = writer_process_of(bridge.proc.pid)
            os.kill(writer, signal.SIGSTOP)
            try:
                stopped_at = [len(inbox) for inbox in heard]
                wait_until(lambda: recording and int(recording[-1]["dropped"]) > 0, 60, "drops counted on /diagnostics")
                # judged by step counts, not timing: both robots took many steps while the writer was stopped
                wait_until(
                    lambda: all(len(inbox) >= n + 100 for inbox, n in zip(heard, stopped_at, strict=True)),
                    60,
                    "100 more steps of each robot with the writer stopped",
                )
                assert recording[-1]["state"] == "recording", recording[-1]
            finally:
                os.kill(writer, signal.SIGCONT)
            code = bridge.stop()
            output = bridge.output()
        trainer.end()
    finally:
        listener.close()
    assert code == 0, output
    assert "records written" in output and "dropped" in output, output
    files = sorted(tmp_path.glob("*.mcap"))
    readers = []
    for reader, _ in read_all(files):
        readers.append(reader)
    assert readers and readers[-1].complete, readers[-1].problem if readers else "empty"
