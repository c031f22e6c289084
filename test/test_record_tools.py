"""Recordings survive a SIGKILL up to the last complete chunk; plugrl-record-info and plugrl-export read them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
from harness import ROOT, ros_env
from mcap.exceptions import McapError
from mcap.reader import NonSeekingReader
from record_scenario import DA, ENVS, H, call_time, episode_length, play, scenario

from plugrl_ros.record import channels
from plugrl_ros.record.read import RecordingReader, in_written_order
from plugrl_ros.record.recorder import Recorder, RecorderState
from plugrl_ros.record.settings import RecordSettings


def record_scenario(folder: Path) -> tuple[list, Path]:
    calls = scenario()
    recorder = Recorder(RecordSettings(path=folder))
    recorder.start()
    play(recorder, calls)
    status = recorder.close()
    assert status.state is RecorderState.STOPPED
    return calls, status.files[0]


def run_tool(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], env=ros_env(), capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[list, Path]:
    return record_scenario(tmp_path_factory.mktemp("rec"))


def run_child_until_killed(folder: Path, whole_group: bool) -> tuple[Path, int, int]:
    """Start the recording child, let it sync half the run and queue the rest, SIGKILL it (or its whole group)."""
    child = subprocess.Popen(
        [sys.executable, str(ROOT / "test" / "record_child.py"), str(folder)],
        env=ros_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the writer process is in it
    )
    try:
        lines = []
        for line in child.stdout:  # event-based: each line is a step the child finished
            lines.append(line.strip())
            if line.startswith(("MORE", "SYNC FAILED", "Traceback")):
                break
        assert lines[-1] == "MORE", lines
        if whole_group:
            os.killpg(child.pid, signal.SIGKILL)
        else:
            child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    return Path(lines[0].split(" ", 1)[1]), int(lines[1].split()[1]), int(lines[2].split()[1])


def wait_gone(pid: int) -> None:
    """Wait for a process that is not our child to end (psutil: no exit code for a non-child)."""
    try:
        psutil.Process(pid).wait(60)
    except psutil.NoSuchProcess:
        pass  # already gone


def test_a_bridge_killed_with_sigkill_still_gets_its_file_finished_by_the_writer_process(tmp_path):
    path, writer_pid, synced = run_child_until_killed(tmp_path, whole_group=False)
    wait_gone(writer_pid)  # its input ended: it finishes the file and exits
    reader = RecordingReader(path)
    sequences = {m.sequence for m in reader if m.topic != channels.RECORDER_TOPIC}
    assert reader.complete and not reader.problem
    assert set(range(1, synced + 1)) <= sequences


def test_a_writer_killed_with_sigkill_leaves_a_file_readable_up_to_its_last_complete_chunk(tmp_path):
    path, writer_pid, synced = run_child_until_killed(tmp_path, whole_group=True)
    wait_gone(writer_pid)
    reader = RecordingReader(path)
    sequences = {m.sequence for m in reader if m.topic != channels.RECORDER_TOPIC}
    assert not reader.complete and "ends early" in reader.problem
    assert set(range(1, synced + 1)) <= sequences  # every call synced before the kill is there

    # the mcap library's own streaming reader gets the same messages before it hits the cut
    seen = set()
    with open(path, "rb") as f:
        with pytest.raises(McapError):  # the missing footer: end of file
            for _, _, message in NonSeekingReader(f).iter_messages(log_time_order=False):
                seen.add(message.sequence)
    assert set(range(1, synced + 1)) <= seen - {0}

    info = run_tool("plugrl_ros.record.info", str(path))
    assert info.returncode == 0, info.stderr
    assert "(cut off)" in info.stdout and "the file ends early" in info.stdout


def test_record_info_summarizes_envs_episodes_returns_steps_drops_and_link_events(recorded):
    calls, path = recorded
    result = run_tool("plugrl_ros.record.info", str(path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"file: {path} (complete)" in out
    assert f"recorder calls: {len(calls) - 1}" in out  # all but the configuration
    assert "dropped calls: 0 (the recorder's own count: 0)" in out
    assert f"envs: {ENVS}" in out
    for env in range(ENVS):
        returns = [c.args[2] for c in calls if c.method == "episode_end" and c.args[0] == env]
        steps = sum(1 for c in calls if c.method == "step" and c.args[0] == env and c.args[2] is not None)
        idle = sum(1 for c in calls if c.method == "step" and c.args[0] == env and c.args[2] is None)
        chunks = sum(1 for c in calls if c.method == "chunk" and c.args[0] == env)
        line = re.search(rf"env {env}: episodes (\d+), steps (\d+) \(\+(\d+) idle\), chunks (\d+)", out)
        assert line and tuple(map(int, line.groups())) == (len(returns), steps, idle, chunks)
        assert f"returns: {', '.join(f'{r:.4g}' for r in returns)}" in out
    assert "link events: 4 (close 1, connect 2, metadata 1)" in out
    assert "close: epoch=1, code=1001, reason=plugrl-server-resync, dropped_envs=[1]" in out
    assert re.search(r"latency: \d+ requests, median 1[0-2]\.\d\d ms", out)


def test_record_info_names_a_missing_file(tmp_path):
    result = run_tool("plugrl_ros.record.info", str(tmp_path / "nope.mcap"))
    assert result.returncode == 2 and "no such file" in result.stderr


def test_export_writes_one_npz_per_episode_with_the_recorded_values(recorded, tmp_path):
    calls, path = recorded
    out = tmp_path / "npz"
    result = run_tool("plugrl_ros.record.export", str(path), "--to", "npz", str(out))
    assert result.returncode == 0, result.stderr
    assert "wrote 6 episode(s)" in result.stdout
    names = sorted(p.name for p in out.glob("*.npz"))
    assert names == [f"env{e}_episode{i:05d}.npz" for e in range(ENVS) for i in range(2)]
    with np.load(out / "env2_episode00001.npz") as ep:
        length = episode_length(2)
        assert ep["step_rewards"].shape == (length,) and ep["dones"][-1] and bool(ep["success"])
        chunks = [c.args[2] for c in calls if c.method == "chunk" and c.args[0] == 2]
        np.testing.assert_array_equal(ep["actions"], np.stack(chunks[len(chunks) // 2 :]))
        assert ep["actions"].shape[1:] == (H, DA)
        images = ep["observations/images/cam"]
        assert images.dtype == np.uint8 and images.shape[0] == len(chunks) // 2 + 1
        obs_calls = [c for c in calls if c.method == "observation" and c.args[0] == 2 and c.args[3] == "infer"]
        np.testing.assert_array_equal(images[0], obs_calls[len(obs_calls) // 2].args[2].images["cam"])
        first_step = next(c for c in calls if c.method == "step" and c.args[0] == 2 and c.args[2] is not None)
        assert ep["step_t_ns"][0] > call_time(first_step)  # the second episode's steps


def test_export_says_which_steps_a_person_commanded_and_what_they_commanded(tmp_path):
    """A train run with a person in the loop: env 0's second step of each chunk was the person's."""
    calls = scenario()
    person_command = np.array([-7.0, 7.0])
    for call in calls:
        if call.method == "step" and call.args[2] is not None:
            person = call.args[0] == 0 and call.args[2] == 1
            call.kwargs["intervention"] = (person, person, person_command if person else None)
    recorder = Recorder(RecordSettings(path=tmp_path / "rec"))
    recorder.start()
    play(recorder, calls)
    path = recorder.close().files[0]
    out = tmp_path / "npz"
    result = run_tool("plugrl_ros.record.export", str(path), "--to", "npz", "--output", str(out))
    assert result.returncode == 0, result.stderr
    with np.load(out / "env0_episode00000.npz") as ep:
        rows = [int(c.args[2]) for c in calls if c.method == "step" and c.args[0] == 0 and c.args[2] is not None]
        expected = np.array([row == 1 for row in rows[: episode_length(0)]])
        np.testing.assert_array_equal(ep["step_person"], expected)
        np.testing.assert_array_equal(ep["step_person_command"][expected], [person_command] * expected.sum())
        assert np.isnan(ep["step_person_command"][~expected]).all()
    with np.load(out / "env2_episode00000.npz") as ep:
        assert "step_person" not in ep  # nobody commanded env 2


def test_export_takes_the_files_before_or_after_the_format_and_says_how_to_write_it_otherwise(recorded, tmp_path):
    after = run_tool("plugrl_ros.record.export", "--to", "npz", str(recorded[1]), "--output", str(tmp_path / "a"))
    before = run_tool("plugrl_ros.record.export", str(recorded[1]), "--to", "npz", "--output", str(tmp_path / "b"))
    assert after.returncode == 0 and before.returncode == 0, after.stderr + before.stderr
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(p.name for p in (tmp_path / "b").iterdir())
    assert list((tmp_path / "a").glob("*.npz"))
    nothing = run_tool("plugrl_ros.record.export", "--to", "npz", "--output", str(tmp_path / "c"))
    assert nothing.returncode == 2 and "plugrl-export FILE.mcap... --to FORMAT --output DIR" in nothing.stderr
    nowhere = run_tool("plugrl_ros.record.export", "--to", "npz", str(recorded[1]))
    assert nowhere.returncode == 2 and "--output" in nowhere.stderr, nowhere.stderr


def test_export_refuses_an_unknown_format(recorded, tmp_path):
    result = run_tool("plugrl_ros.record.export", str(recorded[1]), "--to", "parquet", str(tmp_path))
    assert result.returncode == 2 and "format 'parquet' is not supported; supported: npz" in result.stderr


def test_the_tools_are_installed_commands():
    from plugrl_ros.executables import EXECUTABLES

    assert EXECUTABLES["plugrl-record-info"] == "plugrl_ros.record.info"
    assert EXECUTABLES["plugrl-export"] == "plugrl_ros.record.export"
    for name in ("plugrl-record-info", "plugrl-export"):
        assert (Path(sys.executable).parent / name).is_file(), name


def test_a_runs_parts_are_read_in_the_order_written_whatever_order_they_are_given_in():
    run = [Path(f"runs/plugrl_2026_12_01-05_30_00_{part}.mcap") for part in range(12)]
    other = [Path(f"runs/plugrl_2026_12_01-05_30_00-1_{part}.mcap") for part in range(2)]  # a second run that second
    shell = sorted(run + other, key=str)  # what runs/*.mcap gives: _10 and _11 before _2
    assert shell.index(run[10]) < shell.index(run[2])
    assert in_written_order(shell) == run + other
    # files not named by the recorder keep the order they were given in
    renamed = [Path("b.mcap"), run[3], Path("a.mcap")]
    assert in_written_order(renamed) == renamed
