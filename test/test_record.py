"""The recorder: what goes in comes out of the MCAP file, value by value; it drops instead of blocking; it
stops on a write error without raising into the caller; its files rotate; its settings fail naming the key."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from record_scenario import DA, ENVS, Call, H, call_time, episode_length, play, scenario

from plugrl_ros.params.section import ConfigError, Section
from plugrl_ros.protocol.messages import ObservationRow
from plugrl_ros.record import channels, schemas
from plugrl_ros.record.export import EpisodeAssembler
from plugrl_ros.record.read import RecordingReader, array, image, labelled, values
from plugrl_ros.record.recorder import Recorder, RecordError, RecorderState
from plugrl_ros.record.settings import RecordConfigError, RecordSettings, parse_record_section

pytestmark = [pytest.mark.ros]


def settings(tmp_path: Path, **kw) -> RecordSettings:
    return RecordSettings(path=tmp_path / "rec", **kw)


def record(tmp_path: Path, calls: list[Call], **kw) -> tuple[Recorder, list[Path]]:
    recorder = Recorder(settings(tmp_path, **kw))
    recorder.start()
    play(recorder, calls)
    status = recorder.close()
    assert status.state is RecorderState.STOPPED, status.error
    return recorder, list(status.files)


def read(paths: list[Path]) -> list:
    out = []
    for path in paths:
        reader = RecordingReader(path)
        out.extend(reader)
        assert reader.complete and not reader.problem, reader.problem
    return out


def by_call(messages: list) -> dict[int, list]:
    grouped: dict[int, list] = {}
    for m in messages:
        if m.topic != channels.RECORDER_TOPIC:
            grouped.setdefault(m.sequence, []).append(m)
    return grouped


def check_call(call: Call, msgs: list) -> None:
    """The messages of one recorder call hold exactly what the call was given."""
    t = call_time(call)
    assert all(m.log_time == t for m in msgs), (call.method, [m.log_time for m in msgs], t)
    topics = {m.topic: m for m in msgs}
    if call.method == "observation":
        env, _, row, sent_in = call.args
        assert set(topics) == {
            f"/plugrl/env{env}/{sent_in}/images/cam",
            f"/plugrl/env{env}/{sent_in}/states/q",
            f"/plugrl/env{env}/{sent_in}/states/t",
            f"/plugrl/env{env}/{sent_in}/text",
        }
        cam = topics[f"/plugrl/env{env}/{sent_in}/images/cam"]
        assert cam.schema == schemas.IMAGE and cam.msg.encoding == "rgb8"
        assert (cam.msg.header.stamp.sec * 10**9 + cam.msg.header.stamp.nanosec) == t
        np.testing.assert_array_equal(image(cam), row.images["cam"])
        for name in ("q", "t"):
            np.testing.assert_array_equal(
                array(topics[f"/plugrl/env{env}/{sent_in}/states/{name}"].msg), row.states[name]
            )
        assert topics[f"/plugrl/env{env}/{sent_in}/text"].msg.data == row.text
    elif call.method == "chunk":
        env, _, action = call.args
        (m,) = msgs
        assert m.topic == f"/plugrl/env{env}/action_chunk"
        np.testing.assert_array_equal(array(m.msg), action.astype(np.float64))
        assert [d.label for d in m.msg.layout.dim] == ["step", "action"]
    elif call.method == "step":
        env, _, chunk_step, commanded = call.args
        step = topics.pop(f"/plugrl/env{env}/step")
        assert labelled(step.msg) == {
            "chunk_step": -1.0 if chunk_step is None else chunk_step,
            "idle": float(chunk_step is None),
        }
        expected = {f"/plugrl/env{env}/command/{k}": v for k, v in commanded.items() if v is not None}
        assert set(topics) == set(expected)
        for topic, v in expected.items():
            np.testing.assert_array_equal(array(topics[topic].msg), np.asarray(v, dtype=np.float64))
    elif call.method == "step_result":
        env, _, reward, terminated, truncated, success = call.args
        (m,) = msgs
        assert m.topic == f"/plugrl/env{env}/step_result"
        assert labelled(m.msg) == {
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "success": success,
        }
    elif call.method == "episode_end":
        env, _, ret, length, success = call.args
        (m,) = msgs
        assert labelled(m.msg) == {"return": ret, "length": length, "success": float(success)}
    elif call.method == "link_event":
        _, kind, epoch = call.args
        (m,) = msgs
        assert m.topic == channels.LINK_EVENT_TOPIC and m.msg.message == kind
        expected = {
            "epoch": epoch,
            **{k: v for k, v in call.kwargs.items() if k != "detail"},
            **call.kwargs.get("detail", {}),
        }
        assert values(m.msg) == expected
        assert m.msg.level == (channels.WARN if kind == "close" else channels.OK)
    elif call.method == "latency":
        (m,) = msgs
        assert m.topic == channels.LATENCY_TOPIC and m.msg.data == call.args[1]
    elif call.method == "config":
        (m,) = msgs
        assert json.loads(m.msg.data) == {"parameters": call.args[1], "versions": call.args[2]}
    else:
        raise AssertionError(call.method)


# -- round trip ---------------------------------------------------------------


def test_every_call_of_a_three_env_run_reads_back_value_for_value(tmp_path):
    calls = scenario()
    _, files = record(tmp_path, calls)
    assert len(files) == 1 and files[0].name.startswith("plugrl_") and files[0].suffix == ".mcap"
    grouped = by_call(read(files))
    assert sorted(grouped) == list(range(1, len(calls) + 1))  # one call, one sequence number, none lost
    for seq, call in enumerate(calls, start=1):
        check_call(call, grouped[seq])


def test_deploy_mode_s_calls_read_back_value_for_value_whatever_a_server_puts_in_its_metadata(tmp_path):
    """The applied action beside a step, an answer's outcome and server timing, and a link event whose detail
    holds what a server's metadata may (numpy values, bytes, big arrays) all go through the writer process."""
    applied = np.array([0.5, -1.25, 3.0])
    weird = {"h": np.int64(10), "norm": np.array([1.5, 2.5]), "blob": b"\x00\x01", "big": np.zeros((50, 50))}
    recorder = Recorder(settings(tmp_path))
    recorder.start()
    recorder.step(0, 10, 2, {"arm": applied * 2.0, "gripper": None}, applied)
    recorder.step(0, 20, None, {"arm": np.zeros(3), "gripper": None})
    recorder.answer(0, 30, "applied", 7, round_trip_s=0.04, first_row=2, server_timing={"infer_ms": np.float32(3.5)})
    recorder.answer(0, 40, "rejected", 8, detail="actions: has 3 values per step")
    recorder.link_event(50, "metadata", 1, detail={"env": 0, "metadata": weird})
    recorder.link_event(60, "traceback", 1, detail={"env": 0, "text": "Traceback ...\nRuntimeError: boom"})
    status = recorder.close()
    assert status.state is RecorderState.STOPPED, status.error
    grouped = by_call(read(list(status.files)))
    assert sorted(grouped) == [1, 2, 3, 4, 5, 6]
    topics = {m.topic: m for m in grouped[1]}
    np.testing.assert_array_equal(array(topics["/plugrl/env0/applied_action"].msg), applied)
    np.testing.assert_array_equal(array(topics["/plugrl/env0/command/arm"].msg), applied * 2.0)
    assert labelled(topics["/plugrl/env0/step"].msg) == {"chunk_step": 2.0, "idle": 0.0}
    assert {m.topic for m in grouped[2]} == {"/plugrl/env0/step", "/plugrl/env0/command/arm"}  # no action: idle
    (applied_answer,) = grouped[3]
    assert applied_answer.topic == "/plugrl/env0/answer" and applied_answer.msg.message == "applied"
    assert applied_answer.msg.level == channels.OK
    assert values(applied_answer.msg) == {
        "request": 7,
        "round_trip_s": 0.04,
        "first_row": 2,
        "server_timing": {"infer_ms": 3.5},
    }
    (rejected,) = grouped[4]
    assert rejected.msg.message == "rejected" and rejected.msg.level == channels.WARN
    assert values(rejected.msg) == {"request": 8, "detail": "actions: has 3 values per step"}
    (metadata,) = grouped[5]
    assert values(metadata.msg) == {
        "epoch": 1,
        "env": 0,
        "metadata": {"h": 10, "norm": [1.5, 2.5], "blob": "<2 bytes>", "big": "<array float64 [50, 50]>"},
    }
    (traceback,) = grouped[6]
    assert traceback.msg.level == channels.WARN and values(traceback.msg)["text"].endswith("RuntimeError: boom")


def test_a_step_with_a_person_in_the_loop_records_who_commanded_it_and_the_persons_command(tmp_path):
    """Through the writer process: the flags at every step, the person's command on the steps that were theirs;
    without a person in the loop neither channel is written."""
    person = np.array([-0.5, 2.0])
    recorder = Recorder(settings(tmp_path))
    recorder.start()
    recorder.step(0, 10, 3, {"arm": person * 2.0}, None, (True, True, person))
    recorder.step(1, 20, None, {"arm": np.zeros(2)}, None, (False, True, None))  # a silent device: idle
    recorder.step(0, 30, 4, {"arm": np.ones(2)}, None, (False, False, None))  # the policy's step
    recorder.step(0, 40, 5, {"arm": np.ones(2)})  # no person in the loop
    status = recorder.close()
    assert status.state is RecorderState.STOPPED, status.error
    grouped = {seq: {m.topic: m.msg for m in msgs} for seq, msgs in by_call(read(list(status.files))).items()}
    assert labelled(grouped[1]["/plugrl/env0/intervention"]) == {"person": 1.0, "replaced": 1.0}
    np.testing.assert_array_equal(array(grouped[1]["/plugrl/env0/person_command"]), person)
    assert labelled(grouped[2]["/plugrl/env1/intervention"]) == {"person": 0.0, "replaced": 1.0}
    assert "/plugrl/env1/person_command" not in grouped[2]
    assert labelled(grouped[3]["/plugrl/env0/intervention"]) == {"person": 0.0, "replaced": 0.0}
    assert set(grouped[4]) == {"/plugrl/env0/step", "/plugrl/env0/command/arm"}


def test_the_messages_are_real_ros_2_messages(tmp_path):
    """rclpy's own CDR deserializer (what ros2 bag play uses) decodes what was written, to the same values."""
    from diagnostic_msgs.msg import DiagnosticStatus
    from mcap.reader import make_reader
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import Image
    from std_msgs.msg import Float64MultiArray

    _, files = record(tmp_path, scenario(episodes=1))
    types = {
        schemas.IMAGE: Image,
        schemas.FLOAT64_ARRAY: Float64MultiArray,
        schemas.DIAGNOSTIC_STATUS: DiagnosticStatus,
    }
    seen = set()
    with open(files[0], "rb") as f:
        for schema, channel, message in make_reader(f).iter_messages():
            if schema.name in types and channel.topic not in seen:
                seen.add(channel.topic)
                msg = deserialize_message(message.data, types[schema.name])
                if schema.name == schemas.IMAGE:
                    assert (msg.height, msg.width, msg.encoding, len(msg.data)) == (6, 8, "rgb8", 6 * 8 * 3)
                elif channel.topic.endswith("action_chunk"):
                    assert len(msg.data) == H * DA and msg.layout.dim[0].size == H
                elif schema.name == schemas.DIAGNOSTIC_STATUS:
                    assert msg.name in ("plugrl/link", "plugrl/recorder")
    assert any("images" in t for t in seen) and any("action_chunk" in t for t in seen)


def test_schema_texts_carry_every_type_they_use():
    image = schemas.definition(schemas.IMAGE)
    assert image.startswith("# This message contains an uncompressed image") or "uint8[] data" in image
    assert "MSG: std_msgs/Header" in image and "MSG: builtin_interfaces/Time" in image
    array_text = schemas.definition(schemas.FLOAT64_ARRAY)
    assert "MSG: std_msgs/MultiArrayLayout" in array_text and "MSG: std_msgs/MultiArrayDimension" in array_text
    assert "MSG: diagnostic_msgs/KeyValue" in schemas.definition(schemas.DIAGNOSTIC_STATUS)


def test_jpeg_images_go_in_as_compressed_images_and_come_back_close(tmp_path):
    pytest.importorskip("cv2")
    rng = np.random.default_rng(0)
    smooth = np.clip(np.linspace(0, 255, 64 * 48 * 3).reshape(48, 64, 3) + rng.normal(0, 2, (48, 64, 3)), 0, 255)
    row = ObservationRow(images={"cam": smooth.astype(np.uint8), "gray": np.full((48, 64, 1), 77, np.uint8)})
    _, files = record(tmp_path, [Call("observation", (0, 5, row, "infer"))], image_format="jpeg", jpeg_quality=95)
    msgs = {m.topic: m for m in read(files) if "images" in m.topic}
    cam = msgs["/plugrl/env0/infer/images/cam"]
    assert cam.schema == schemas.COMPRESSED_IMAGE and "jpeg" in cam.msg.format
    assert np.abs(image(cam).astype(int) - row.images["cam"].astype(int)).mean() < 3  # lossy, but RGB order kept
    np.testing.assert_array_equal(image(msgs["/plugrl/env0/infer/images/gray"]), row.images["gray"])


def test_png_images_come_back_exactly(tmp_path):
    pytest.importorskip("cv2")
    img = np.random.default_rng(1).integers(0, 256, (10, 12, 3), dtype=np.uint8)
    _, files = record(
        tmp_path, [Call("observation", (2, 5, ObservationRow(images={"c": img}), "feedback"))], image_format="png"
    )
    (m,) = [m for m in read(files) if m.topic == "/plugrl/env2/feedback/images/c"]
    np.testing.assert_array_equal(image(m), img)


# -- episodes rebuilt for export ------------------------------------------------


def test_episodes_rebuild_from_the_recording_chunk_by_chunk_and_step_by_step(tmp_path):
    calls = scenario(episodes=2)
    _, files = record(tmp_path, calls)
    assembler = EpisodeAssembler()
    found = []
    for rec in read(files):
        found.extend(assembler.feed(rec))
    found.extend(assembler.finish())
    assert assembler.unfinished == 0 and not assembler.skipped
    assert sorted((e.env, e.index) for e in found) == [(e, i) for e in range(ENVS) for i in range(2)]
    chunks_of: dict[tuple[int, int], list[np.ndarray]] = {}  # (env, episode) -> its chunks, from the calls
    episode_of = dict.fromkeys(range(ENVS), 0)
    for c in calls:
        if c.method == "chunk":
            chunks_of.setdefault((c.args[0], episode_of[c.args[0]]), []).append(c.args[2])
        elif c.method == "episode_end":
            episode_of[c.args[0]] += 1
    for ep in found:
        a, env = ep.arrays, ep.env
        n = episode_length(env)  # the dropped chunk's step counts: it ran on the robot
        assert a["step_actions"].shape == (n, DA) and a["step_rewards"].shape == (n,)
        mine = chunks_of[(env, ep.index)]
        np.testing.assert_array_equal(a["actions"], np.stack(mine).astype(np.float64))
        # each step's applied action is its chunk's row; commanded = 2x (what the scenario published)
        rows = np.concatenate([chunk[:k] for chunk, k in zip(a["actions"], a["chunk_steps"])])
        np.testing.assert_array_equal(a["step_actions"], rows)
        np.testing.assert_array_equal(a["commanded/arm"], rows * 2.0)
        js = np.concatenate([np.arange(k) for k in a["chunk_steps"]])  # each step's index in its chunk
        gripper = a["commanded/gripper"][:, 0]
        np.testing.assert_array_equal(np.isnan(gripper), js % 2 == 1)  # it published nothing on odd steps
        np.testing.assert_array_equal(gripper[js % 2 == 0], js[js % 2 == 0])
        assert a["rewards"].sum() == pytest.approx(a["step_rewards"].sum())
        assert a["dones"][-1] and not a["dones"][:-1].any() and a["terminated"][-1]
        assert bool(a["complete"]) and float(a["episode_return"]) == pytest.approx(a["step_rewards"].sum())
        assert a["observations/images/cam"].shape[0] == len(mine) + 1  # each chunk's + the terminal one
        np.testing.assert_array_equal(a["observations/states/t"][-1], [float(episode_length(env))])
        if (env, ep.index) == (1, 1):
            assert a["fed_back"].tolist() == [False] + [True] * (len(mine) - 1)  # the reconnect dropped the first
            assert a["chunk_steps"][0] == 1
        else:
            assert a["fed_back"].all()


# -- rotation -------------------------------------------------------------------


def _check_parts(files: list[Path], calls: list[Call]) -> list[list]:
    parts = [list(RecordingReader(f)) for f in files]
    seen: list[int] = []
    for f, part in zip(files, parts):
        assert RecordingReader(f) is not None
        assert part[0].topic == channels.CONFIG_TOPIC  # every part says how the run was configured
        seen.extend(
            sorted({m.sequence for m in part if m.topic not in (channels.CONFIG_TOPIC, channels.RECORDER_TOPIC)})
        )
    assert seen == list(range(2, len(calls) + 1))  # every call once, in order, across the parts
    return parts


def test_files_rotate_by_size_and_every_part_is_complete(tmp_path):
    calls = scenario()
    _, files = record(tmp_path, calls, max_file_bytes=8 * 1024, chunk_bytes=2 * 1024)
    assert len(files) > 2
    assert [f.name.rsplit("_", 1)[1] for f in files] == [f"{i}.mcap" for i in range(len(files))]
    _check_parts(files, calls)
    for f in files[:-1]:
        assert f.stat().st_size >= 8 * 1024
    read(files)  # each part ends with its summary and footer


def test_files_rotate_by_message_time(tmp_path):
    calls = scenario()
    _, files = record(tmp_path, calls, max_file_duration_s=0.05)
    span_s = (call_time(calls[-1]) - call_time(calls[1])) / 1e9
    assert len(files) == pytest.approx(span_s / 0.05, abs=1.5)
    for part in _check_parts(files, calls):
        times = [m.log_time for m in part if m.topic != channels.CONFIG_TOPIC]
        assert max(times) - min(times) < 0.05e9


# -- never blocking, never raising ------------------------------------------------


class GatedStream(io.RawIOBase):
    """A file whose writes wait for a gate: the writer thread, slowed at the library boundary."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "xb")
        self.gate = threading.Event()
        self.gate.set()
        self.blocked = threading.Event()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if not self.gate.is_set():
            self.blocked.set()
            self.gate.wait()
        return self._file.write(data)

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        super().close()  # flushes first
        self._file.close()


def test_a_stuck_writer_makes_calls_drop_and_count_never_wait(tmp_path):
    streams: list[GatedStream] = []

    def opener(path: Path) -> GatedStream:
        streams.append(GatedStream(path))
        return streams[-1]

    recorder = Recorder(settings(tmp_path, queue_bytes=1024 * 1024, chunk_bytes=512), opener=opener)
    recorder.start()
    streams[0].gate.clear()
    recorder.step_result(0, 1, 0.0, False, False, False)  # the writer takes it and gets stuck writing its chunk
    assert streams[0].blocked.wait(30)
    frame = np.zeros((200, 170, 3), np.uint8)  # ~100 KB: a large item
    row = ObservationRow(images={"cam": frame})
    for i in range(200):  # 20 MB against a 1 MB budget, while the writer cannot move
        recorder.observation(0, 10 + i, row, "infer")
    for i in range(300):  # small records keep their reserve
        recorder.step_result(1, 1000 + i, float(i), False, False, False)
    stuck = recorder.status()
    assert not streams[0].gate.is_set()  # everything above ran while the writer was stuck: nothing waited on it
    frames_in = int(0.75 * 1024 * 1024) // (frame.nbytes + 256)
    assert stuck.dropped == stuck.dropped_large == 200 - frames_in
    assert stuck.accepted == 1 + frames_in + 300
    streams[0].gate.set()
    final = recorder.close()
    assert final.state is RecorderState.STOPPED and final.written == final.accepted
    messages = read(list(final.files))
    sequences = sorted({m.sequence for m in messages if m.topic != channels.RECORDER_TOPIC})
    assert len(sequences) == final.accepted
    assert sequences[-1] - sequences[0] + 1 - len(sequences) == final.dropped  # the gaps are the drops
    reports = [values(m.msg) for m in messages if m.topic == channels.RECORDER_TOPIC]
    assert reports[-1]["dropped"] == final.dropped


def test_a_stopped_writer_process_makes_calls_drop_and_count_never_wait(tmp_path):
    recorder = Recorder(settings(tmp_path, queue_bytes=1024 * 1024))
    recorder.start()
    assert recorder.writer_pid is not None
    os.kill(recorder.writer_pid, signal.SIGSTOP)  # the writer process cannot read: its pipe fills
    try:
        frame = np.zeros((200, 170, 3), np.uint8)  # ~100 KB: more than a pipe holds, so its forwarding waits
        row = ObservationRow(images={"cam": frame})
        for i in range(200):
            recorder.observation(0, 10 + i, row, "infer")
        for i in range(300):
            recorder.step_result(1, 1000 + i, float(i), False, False, False)
        stuck = recorder.status()
    finally:
        os.kill(recorder.writer_pid, signal.SIGCONT)
    frames_in = int(0.75 * 1024 * 1024) // (frame.nbytes + 256)
    assert stuck.dropped == stuck.dropped_large == 200 - frames_in
    assert stuck.accepted == frames_in + 300
    final = recorder.close()
    assert final.state is RecorderState.STOPPED and final.written == final.accepted
    messages = read(list(final.files))
    sequences = sorted({m.sequence for m in messages if m.topic != channels.RECORDER_TOPIC})
    assert len(sequences) == final.accepted
    assert sequences[-1] - sequences[0] + 1 - len(sequences) == final.dropped
    assert [values(m.msg) for m in messages if m.topic == channels.RECORDER_TOPIC][-1]["dropped"] == final.dropped


def test_a_writer_process_that_dies_stops_recording_with_an_error_and_the_caller_never_sees_it(tmp_path):
    failed = threading.Event()
    errors: list[str] = []
    recorder = Recorder(settings(tmp_path), on_error=lambda m: (errors.append(m), failed.set()))
    recorder.start()
    recorder.step_result(0, 1, 1.0, False, False, False)
    assert recorder.writer_pid is not None
    os.kill(recorder.writer_pid, signal.SIGKILL)
    assert failed.wait(30)
    status = recorder.status()
    assert status.state is RecorderState.FAILED and errors == [status.error]
    assert "writer process" in status.error and "the robot keeps running" in status.error
    for i in range(50):  # no exception, no growth
        recorder.observation(0, i, ObservationRow(states={"q": np.zeros(2)}), "infer")
    assert recorder.status().accepted == status.accepted
    assert recorder.close().state is RecorderState.FAILED


class FailingStream(io.RawIOBase):
    """A disk that fills up after the file's header: every later write fails with ENOSPC."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "xb")
        self.fail = False

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self.fail:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._file.write(data)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        super().close()  # flushes first
        self._file.close()


def _run_until_failure(recorder: Recorder, failed: threading.Event, n: int) -> None:
    noise = np.random.default_rng(0).integers(0, 256, (200, 170, 3), dtype=np.uint8)  # does not compress
    row = ObservationRow(images={"cam": noise}, states={"q": np.zeros(3)})
    for i in range(n):
        recorder.observation(i % 3, i, row, "infer")
        recorder.step_result(i % 3, i, 1.0, False, False, False)
    assert failed.wait(60)


def test_a_write_error_stops_recording_with_an_error_and_the_caller_never_sees_it(tmp_path):
    streams: list[FailingStream] = []
    errors: list[str] = []
    failed = threading.Event()

    def opener(path: Path) -> FailingStream:
        streams.append(FailingStream(path))
        return streams[-1]

    def on_error(message: str) -> None:
        errors.append(message)
        failed.set()

    recorder = Recorder(settings(tmp_path, chunk_bytes=1024), opener=opener, on_error=on_error)
    recorder.start()
    streams[0].fail = True
    _run_until_failure(recorder, failed, 20)
    status = recorder.status()
    assert status.state is RecorderState.FAILED
    assert "No space left on device" in status.error and "the robot keeps running" in status.error
    assert errors == [status.error]  # reported once
    accepted = status.accepted
    for i in range(100):  # calls after the failure are no-ops, not exceptions
        recorder.step_result(0, i, 0.0, False, False, False)
    assert recorder.status().accepted == accepted
    assert recorder.close().state is RecorderState.FAILED


def test_a_full_disk_stops_recording_and_keeps_what_was_written(tmp_path):
    mount = tmp_path / "small-disk"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=False, capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a 1 MB tmpfs here (needs root): {result.stderr.strip()}")
    failed = threading.Event()
    recorder = Recorder(
        RecordSettings(path=mount, chunk_bytes=64 * 1024, queue_bytes=16 * 1024 * 1024), on_error=lambda m: failed.set()
    )
    try:
        recorder.start()
        _run_until_failure(recorder, failed, 40)  # 4 MB of frames for a 1 MB disk
        status = recorder.status()
        assert status.state is RecorderState.FAILED and "No space left on device" in status.error
        reader = RecordingReader(status.files[0])
        kept = list(reader)
        assert not reader.complete and reader.problem  # no footer: the disk was full
        assert any(m.topic == "/plugrl/env0/infer/images/cam" for m in kept)  # but the chunks before it are there
    finally:
        recorder.close()
        if subprocess.run(["umount", str(mount)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_recording_folder_that_cannot_be_made_fails_at_start_naming_the_key(tmp_path):
    blocker = tmp_path / "rec"
    blocker.write_text("a file where the folder should be")
    with pytest.raises(RecordError, match=r"record\.path: cannot create the folder .*rec"):
        Recorder(RecordSettings(path=blocker / "inner")).start()


def test_two_runs_in_the_same_second_get_two_files(tmp_path):
    first = Recorder(settings(tmp_path), wall_clock=lambda: 1_790_000_000.0)
    second = Recorder(settings(tmp_path), wall_clock=lambda: 1_790_000_000.0)
    a, b = first.start(), second.start()
    first.close()
    second.close()
    assert a != b and a.name == "plugrl_2026_09_21-14_13_20_0.mcap" and b.name == "plugrl_2026_09_21-14_13_20-1_0.mcap"


# -- settings ---------------------------------------------------------------------


def test_recording_is_off_unless_a_path_is_given_and_the_declared_defaults_are_the_settings_defaults():
    parsed = parse_record_section(Section({}, "record"))
    assert not parsed.enabled and parsed == RecordSettings()


def test_the_record_section_parses_into_typed_settings():
    s = parse_record_section(
        Section(
            {
                "path": "~/runs",
                "max_file_mb": 512,
                "max_file_duration_s": 600.0,
                "queue_mb": 64.0,
                "compression": "zstd",
            },
            "record",
        ),
        ConfigError,
    )
    assert s.enabled and s.path == Path("~/runs").expanduser()
    assert (s.max_file_bytes, s.max_file_duration_s, s.queue_bytes) == (512 * 1024 * 1024, 600.0, 64 * 1024 * 1024)
    assert s.compression == "zstd" and s.image_format == "raw"


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"queue_mb": 0}, r"record\.queue_mb: got 0\.0; must be greater than 0"),
        ({"image_format": "gif"}, r"record\.image_format: got 'gif'; allowed: raw, jpeg, png"),
        ({"max_file_mb": -1}, r"record\.max_file_mb: got -1\.0; must be at least 0"),
        ({"compression": "gzip"}, r"record\.compression: got 'gzip'; allowed: none, lz4, zstd"),
        ({"jpeg_quality": 101}, r"record\.jpeg_quality: got 101; must be at most 100"),
        ({"max_size": 3}, r"record\.max_size: got 3; unknown key under record"),
    ],
)
def test_a_bad_record_value_fails_naming_the_key(values, match):
    with pytest.raises(ConfigError, match=match):
        parse_record_section(Section(values, "record"), ConfigError)


def test_compressed_images_without_opencv_fail_at_startup_naming_the_key(monkeypatch):
    import plugrl_ros.record.settings as record_settings

    monkeypatch.setattr(record_settings.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RecordConfigError, match=r"record\.image_format: got 'jpeg'; compressing images needs OpenCV"):
        parse_record_section(Section({"path": "/tmp/x", "image_format": "jpeg"}, "record"))


def test_record_path_in_the_bridge_config_turns_recording_on():
    from plugrl_ros.ros.config import load_config

    minimal = {
        "observations.states.pos.topic": "state",
        "observations.states.pos.type": "std_msgs/Float64MultiArray",
        "actions.arm.topic": "cmd",
        "actions.arm.type": "std_msgs/Float64MultiArray",
        "actions.arm.slice": [0, 2],
    }
    assert load_config(minimal).record == RecordSettings()
    recorded = load_config({**minimal, "record.path": "/tmp/runs"}).record
    assert recorded.enabled and recorded.path == Path("/tmp/runs")


def test_a_bridge_recording_rotates_by_default_every_ten_minutes_or_two_gib(tmp_path):
    """A long run never holds one ever-growing file (the writer keeps an open file's index in memory)."""
    from plugrl_ros.ros.config import load_config

    minimal = {
        "observations.states.pos.topic": "state",
        "observations.states.pos.type": "std_msgs/Float64MultiArray",
        "actions.arm.topic": "cmd",
        "actions.arm.type": "std_msgs/Float64MultiArray",
        "actions.arm.slice": [0, 2],
        "record.path": str(tmp_path / "rec"),
    }
    defaults = load_config(minimal).record
    assert (defaults.max_file_duration_s, defaults.max_file_bytes) == (600.0, 2048 * 1024 * 1024)
    off = load_config({**minimal, "record.max_file_mb": 0.0, "record.max_file_duration_s": 0.0}).record
    assert (off.max_file_duration_s, off.max_file_bytes) == (None, None)
    # the default settings, over 25 minutes of message time: three files
    recorder = Recorder(defaults)
    recorder.start()
    recorder.config(0, {"control.rate_hz": 1.0}, {"plugrl_ros": "0.1.0"})
    for minute in range(25):
        recorder.latency(minute * 60 * 10**9 + 1, 0.01)
    status = recorder.close()
    assert status.state is RecorderState.STOPPED, status.error
    assert len(status.files) == 3, status.files


def test_calls_from_several_threads_are_numbered_in_the_order_they_are_queued():
    from plugrl_ros.record.drop_queue import DropQueue

    queue: DropQueue[int] = DropQueue(max_bytes=10**9)
    start = threading.Barrier(3)

    def produce(tag: int) -> None:
        start.wait()
        for i in range(2000):
            queue.put(tag * 10000 + i, 10)

    threads = [threading.Thread(target=produce, args=(tag,)) for tag in (1, 2)]
    for t in threads:
        t.start()
    start.wait()
    for t in threads:
        t.join()
    queue.close()
    taken = []
    while (batch := queue.take_all(0.0)) is not None:
        taken.extend(batch)
    assert [number for number, _, _ in taken] == list(range(1, 4001))  # numbers follow queue order exactly
    for tag in (1, 2):  # and each producer's items keep their order
        assert [item for _, item, _ in taken if item // 10000 == tag] == [tag * 10000 + i for i in range(2000)]
