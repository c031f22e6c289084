"""The bridge records a real run: probe robot and bridge as ROS processes, the test trainer keeping a transcript.

The recording is read back with the mcap reader and compared, transition by
transition, with what the test trainer received and sent (its transcript) and
with what the actuators' subscribers received.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from harness import Child, Robot, TrainerThread, free_port, python_module, ros_env, statuses, wait_until
from std_msgs.msg import Float64MultiArray
from test_faults import probe_bridge_command, probe_robot, shown, step_of, trainer_settings, wait_for_actuators
from test_record_tools import wait_gone

from plugrl_ros.record.export import EpisodeAssembler
from plugrl_ros.record.read import RecordingReader, array, labelled, read_all, values

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
    check_against_transcript(transcript, tagged)

    # -- the resync's close dropped chunks, and the recording says which
    closes = [values(rec.msg) for rec in records if rec.topic == "/plugrl/link/event" and rec.msg.message == "close"]
    assert any(c.get("dropped_envs") for c in closes), closes
    check_commands(records, commands)


def check_against_transcript(transcript: list, tagged: list[tuple[int, object]]) -> None:
    """Per connection and env: the observations the trainer received, the chunks it sent (each env's slice) and
    the rewards fed back are the recorded ones (``tagged``: records by connection, numbered as the trainer's)."""
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
    # every env reached the trainer on the last connection (on the first, an env whose robot DDS had not yet
    # matched may not have started before the trainer's resync: the bridge starts no chunk before that)
    last = max(entry.connection for entry in transcript)
    assert {env for connection, env in sent if connection == last} == set(range(N_ENVS)), sorted(sent)
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


MISSED_AT_START = 25  # commands (per env) that may go out before DDS matched the test's reader


def check_commands(records: list, commands: list[list[np.ndarray]]) -> None:
    """What the actuators' subscribers received is what was recorded as commanded, in order."""
    for env in range(N_ENVS):
        commanded = [array(rec.msg).tolist() for rec in records if rec.topic.startswith(f"/plugrl/env{env}/command/")]
        heard = [c.tolist() for c in commands[env]]
        assert commanded, f"env {env}: no command recorded"
        # shutdown's idle commands (none for the probe: idle none) come after the last recorded step
        # A command published before the bridge's writer matched the test's reader is lost: DDS matches each
        # direction on its own, so the listener seeing the publisher (wait_for_actuators) does not mean the
        # publisher sees it yet. Seen with the Jazzy wheels on a loaded host: 8 commands in timer mode (160 ms).
        # Allowed: half a second's worth at 50 Hz, at the start only; from there every command, in order.
        skip = next((i for i in range(len(commanded)) if commanded[i:] == heard[: len(commanded) - i]), None)
        assert skip is not None, f"env {env}: the commands heard are not the recorded ones from some point on"
        assert skip <= MISSED_AT_START, f"env {env}: the first {skip} commands were not heard"


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


# -- a killed trainer, a killed bridge ----------------------------------------------------


def test_a_trainer_killed_mid_chunk_leaves_the_break_on_record_and_no_transition_spans_it(tmp_path):
    """SIGKILL the trainer while every robot runs a chunk; a second trainer takes over on the same port.

    The recording says where the link broke (its close, the envs whose chunk it dropped and whose episode it
    ended), what the second trainer saw equals what was recorded after the break, and no transition, chunk or
    exported episode sums rewards from both sides of it.
    """
    horizon = 6
    port = free_port()
    uri = f"ws://127.0.0.1:{port}"
    listener = Robot()
    doomed = Child(
        python_module(
            "plugrl_ros.tools.test_trainer",
            *("--port", str(port), "--script", "serve", "--horizon", str(horizon), "--n-envs", str(N_ENVS)),
            *("--metadata-delay", "0.05"),
        )
    )
    try:
        heard = [listener.listen(Float64MultiArray, f"/probe{i}/action") for i in range(N_ENVS)]
        with shown(doomed, "killed trainer"):
            wait_until(lambda: "listening on" in doomed.output(), 20, "the first trainer listening")
            command = probe_bridge_command(uri, N_ENVS, mode="timer", rate=20.0)
            command += ["-p", f"record.path:={tmp_path}"]
            with probe_robot(N_ENVS), shown(Child(command), "bridge") as bridge:
                wait_for_actuators(listener, N_ENVS)

                def mid_chunk() -> bool:  # timer mode at 20 Hz: a chunk of 6 takes 0.3 s
                    msgs = heard[2].msgs()
                    return len(msgs) >= 2 * horizon and step_of(msgs[-1]) == 2

                wait_until(mid_chunk, 60, "probe2 in the middle of a chunk (step 2 of 6)")
                doomed.proc.kill()  # SIGKILL: no close frame
                doomed.wait(10)
                wait_until(lambda: "cannot reach the trainer" in bridge.output(), 30, "the bridge retrying")
                trainer = TrainerThread(
                    trainer_settings(port=port, script=("stop",), horizon=horizon, n_envs=N_ENVS, keep_transcript=True)
                )
                trainer.start()
                code = bridge.wait(90)
                output = bridge.output()
            report = trainer.report(30)
    finally:
        listener.close()
    assert code == 0, output
    assert report.failed == 0 and not report.incomplete, report.text() + output
    files = sorted(tmp_path.glob("*.mcap"))
    records, readers = [], []
    for reader, recorded in read_all(files):
        records.append(recorded)
        readers.append(reader)
    assert len(files) == 1 and readers[-1].complete, readers[-1].problem

    # -- the break is on record: the close (lost: no close frame), the dropped chunks, the ended episodes
    events = [(r.log_time, r.msg.message, values(r.msg)) for r in records if r.topic == "/plugrl/link/event"]
    kinds = [kind for _, kind, _ in events]
    assert kinds[:4] == ["connect", "metadata", "close", "connect"], kinds
    t_break, _, close = events[2]
    assert close["reason"].startswith("connection lost"), close
    assert 2 in close["dropped_envs"], close  # probe2 was at step 2 of 6
    # reset.on_start: a new connection starts fresh episodes (an env whose episode had just ended starts none)
    assert 2 in close["restarted_envs"] and set(close["restarted_envs"]) <= set(range(N_ENVS)), close
    unanswered = close.get("unanswered_envs", [])
    assert set(unanswered) <= set(close["dropped_envs"]), close
    for env in close["dropped_envs"]:
        before = [r for r in records if env_of(r.topic) == env and r.log_time <= t_break]
        last_chunk = max(i for i, r in enumerate(before) if r.topic.endswith("/action_chunk"))
        fed_back = [r for r in before[last_chunk:] if "/feedback/" in r.topic]
        if env in unanswered:  # its chunk was fed back; the request sent after it went unanswered
            assert fed_back, f"env {env}: said to await an answer, but its last chunk was never fed back"
        else:  # the chunk (or the feedback held for it) went with the connection: never fed back
            assert not fed_back, f"env {env}: said to have lost its chunk, but it was fed back"

    # -- after the break: what the second trainer saw and sent is what was recorded on connection 2
    tagged = [(c - 1, rec) for c, rec in by_connection(records) if c >= 2]
    check_against_transcript(list(report.transcript), tagged)

    # -- no transition sums rewards across the break: after it, at most the step in flight reports (its reward
    # goes nowhere), and every chunk's reward on connection 2 counts only its own steps (checked above)
    for env in range(N_ENVS):
        after = [r for c, r in tagged if env_of(r.topic) == env]
        first_chunk = next(i for i, r in enumerate(after) if r.topic.endswith("/action_chunk"))
        results = [r for r in after[:first_chunk] if r.topic.endswith("/step_result")]
        assert len(results) <= 1, f"env {env}: {len(results)} step results between the break and the next chunk"
    assembler = EpisodeAssembler()
    episodes = [ep for rec in records for ep in assembler.feed(rec)] + list(assembler.finish())
    assert episodes and assembler.abandoned >= 1, (len(episodes), assembler.abandoned)
    for ep in episodes:
        times = ep.arrays["step_t_ns"]
        assert times.max() < t_break or times.min() > t_break, f"env {ep.env} episode {ep.index} spans the break"
        assert ep.arrays["rewards"].sum() == pytest.approx(ep.arrays["step_rewards"].sum())
        assert ep.arrays["episode_return"] == pytest.approx(ep.arrays["step_rewards"].sum())
        assert int(ep.arrays["episode_length"]) == len(times)


@pytest.mark.parametrize("killed", ["bridge", "bridge and writer"])
def test_a_bridge_killed_mid_run_leaves_a_file_readable_up_to_its_last_complete_chunk(tmp_path, killed):
    """SIGKILL the bridge mid-run: its writer process finishes the file; kill the writer too and the file
    still reads, up to its last complete chunk (``record.flush_interval_s`` 0.2: chunks close often)."""
    port = free_port()
    trainer = TrainerThread(trainer_settings(port=port, script=("stop",), n_envs=2, feedbacks_per_connection=100_000))
    listener = Robot()
    try:
        heard = [listener.listen(Float64MultiArray, f"/probe{i}/action") for i in range(2)]
        command = probe_bridge_command(f"ws://127.0.0.1:{port}", 2, mode="timer", rate=50.0)
        command += ["-p", f"record.path:={tmp_path}", "-p", "record.flush_interval_s:=0.2"]
        # UDP only: a process killed outright leaves no shared-memory segments behind
        with probe_robot(2), shown(Child(command, env=ros_env(FASTDDS_BUILTIN_TRANSPORTS="UDPv4")), "bridge") as bridge:
            wait_for_actuators(listener, 2)
            trainer.start()
            wait_until(lambda: all(len(inbox) >= 50 for inbox in heard), 60, "both robots stepping")
            writer = writer_process_of(bridge.proc.pid)
            if killed == "bridge and writer":
                os.kill(writer, signal.SIGKILL)
            bridge.proc.kill()
            assert bridge.wait(10) == -signal.SIGKILL
            wait_gone(writer)  # its input ended: it finishes the file and exits (or it was killed)
            steps_heard = min(len(inbox) for inbox in heard)
        trainer.end()
    finally:
        listener.close()
    files = sorted(tmp_path.glob("*.mcap"))
    assert len(files) == 1, files
    reader = RecordingReader(files[0])
    records = list(reader)
    if killed == "bridge":
        assert reader.complete and not reader.problem  # the writer process finished it
    else:
        assert not reader.complete and "ends early" in reader.problem
    steps = [r for r in records if r.topic.endswith("/step") and not labelled(r.msg)["idle"]]
    # the file holds the run up to its last complete chunk: with 0.2 s chunks, most of the steps heard
    assert len(steps) >= steps_heard, (len(steps), steps_heard)
    assert any(r.topic.endswith("/action_chunk") for r in records)
    sequences = sorted({r.sequence for r in records if r.topic != "/plugrl/recorder"})
    assert sequences == list(range(1, len(sequences) + 1))  # a prefix of the run: nothing missing in between
    info = subprocess.run(
        [sys.executable, "-m", "plugrl_ros.record.info", str(files[0])],
        env=ros_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert info.returncode == 0, info.stderr
    assert ("(complete)" if killed == "bridge" else "(cut off)") in info.stdout


def test_a_bridge_stopped_by_sigint_records_its_close_after_the_connect_and_the_metadata(tmp_path):
    """Ctrl-C while the trainer serves: the recording ends with the link's close (the bridge closing with
    1000), as it holds the connect and the metadata; nothing of the link is recorded after it."""
    port = free_port()
    trainer = TrainerThread(trainer_settings(port=port, script=("serve",), n_envs=1, horizon=4))
    listener = Robot()
    try:
        heard = listener.listen(Float64MultiArray, "/probe0/action")
        command = probe_bridge_command(f"ws://127.0.0.1:{port}", 1, mode="timer", rate=50.0)
        command += ["-p", f"record.path:={tmp_path}"]
        with probe_robot(1), shown(Child(command), "bridge") as bridge:
            wait_for_actuators(listener, 1)
            trainer.start()
            wait_until(lambda: len(heard.msgs()) >= 8, 60, "the robot stepping under the trainer")
            bridge.proc.send_signal(signal.SIGINT)
            code = bridge.wait(30)
            output = bridge.output()
    finally:
        listener.close()
        trainer.end()
        trainer.join(30)
    assert code == 0, output
    files = sorted(tmp_path.glob("*.mcap"))
    records, readers = [], []
    for reader, recorded in read_all(files):
        records.append(recorded)
        readers.append(reader)
    assert len(files) == 1 and readers[-1].complete, readers[-1].problem
    events = [(r.msg.message, values(r.msg)) for r in records if r.topic == "/plugrl/link/event"]
    assert [kind for kind, _ in events] == ["connect", "metadata", "close"], events
    close = events[-1][1]
    assert close["epoch"] == 1 and close["reason"].startswith("client stopped"), close
    assert "trainer connection closed (client stopped" in output, output
