"""``plugrl-export --to lerobot`` on a real train recording: the probe robot, a bridge that records and the test
trainer (resync, then stop). With chunks of one step every step becomes a frame holding its chunk's observation
and action; with chunks of four the export refuses, saying why."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("av")

from harness import Child, Robot, TrainerThread, free_port, python_module
from std_msgs.msg import Float64MultiArray
from test_faults import probe_bridge_command, probe_robot, shown, trainer_settings, wait_for_actuators

from plugrl_ros.record.export import iter_episodes
from plugrl_ros.record.train_export import EpisodeAssembler

pytestmark = [pytest.mark.ros, pytest.mark.websockets, pytest.mark.slow, pytest.mark.lerobot, pytest.mark.timeout(180)]


def record(tmp_path, horizon: int) -> list:
    port = free_port()
    trainer = TrainerThread(trainer_settings(port=port, script=("resync", "stop"), n_envs=2, horizon=horizon))
    listener = Robot()
    try:
        for i in range(2):  # the trainer starts once the bridge's actuators are heard
            listener.listen(Float64MultiArray, f"/probe{i}/action")
        command = probe_bridge_command(f"ws://127.0.0.1:{port}", 2, mode="lockstep", rate=50.0)
        command += ["-p", f"record.path:={tmp_path}"]
        with probe_robot(2), shown(Child(command), "bridge") as bridge:
            wait_for_actuators(listener, 2)
            trainer.start()
            code = bridge.wait(90)
            output = bridge.output()
        report = trainer.report(30)
    finally:
        listener.close()
    assert code == 0, output
    assert report.failed == 0, report.text() + output
    return sorted(tmp_path.glob("*.mcap"))


def export(files: list, out) -> subprocess.CompletedProcess:
    command = python_module("plugrl_ros.record.export", *map(str, files), "--to", "lerobot", "--output", str(out))
    return subprocess.run([*command, "--task", "probe"], check=False, capture_output=True, text=True, timeout=120)


def test_a_train_recording_with_chunks_of_one_step_gives_a_frame_per_step(tmp_path):
    import pyarrow.parquet as pq

    files = record(tmp_path / "recording", horizon=1)
    done = export(files, tmp_path / "dataset")
    assert done.returncode == 0, done.stderr
    state, action, reward = [], [], []
    for episode in iter_episodes(files, EpisodeAssembler(), []):
        ep = episode.arrays
        ran = np.flatnonzero(ep["chunk_steps"] == 1)
        assert len(ran) == len(ep["chunk_steps"]), "a chunk that never ran: this run has no reconnect"
        state.append(np.concatenate([ep["observations/states/a"][ran], ep["observations/states/t"][ran]], axis=1))
        action.append(ep["step_actions"])
        reward.append(ep["step_rewards"])
    assert state, done.stdout
    data = pq.read_table(tmp_path / "dataset/data/chunk-000/file-000.parquet").to_pydict()
    np.testing.assert_array_equal(np.array(data["observation.state"]), np.concatenate(state).astype(np.float32))
    np.testing.assert_array_equal(np.array(data["action"]), np.concatenate(action).astype(np.float32))
    np.testing.assert_array_equal(np.array(data["next.reward"]), np.concatenate(reward).astype(np.float32))


def test_a_train_recording_with_longer_chunks_is_refused_naming_h(tmp_path):
    files = record(tmp_path / "recording", horizon=4)
    done = export(files, tmp_path / "dataset")
    assert done.returncode == 2, done.stdout
    assert "H = 4 steps" in done.stderr and "one observation per chunk" in done.stderr, done.stderr
