"""``plugrl-export --to lerobot`` on a real recording: a scripted person demonstrates on the demo reachers (robot
node, a bridge in teleop mode that records into a new file every 5 s, the scripted gamepad), the rotated run's
files are exported together with both video codecs and with PNG images, and the folder is read back: with pyarrow
and PyAV against LeRobot's v3.0 layout
(the lerobot extra), and by LeRobot's own ``LeRobotDataset`` where LeRobot is installed (the ``lerobot`` mark).
The recording's side of every comparison is the per-step arrays the npz export writes of the same files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("av")

from harness import ROOT, python_module, record_demo_teleop

pytestmark = [pytest.mark.ros, pytest.mark.slow, pytest.mark.lerobot]

DEMO = ROOT / "config" / "demo.yaml"
RECORD_S = 14.0
TASK = "reach the target"
STATE_NAMES = [
    "shoulder.position",
    "elbow.position",
    "shoulder.velocity",
    "elbow.velocity",
    "target.0",
    "target.1",
    "target.2",
    "target.3",
]


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> list[Path]:
    record = tmp_path_factory.mktemp("recording")
    # a person who rests now and then (drives only when the arm strays), so demonstrations are cut
    person = ("--minutes", "0", "--stray", "0.05", "--patience", "0.3")
    # a rotated run: a new file every 5 s, so demonstrations run across files, as hours-long recordings do
    code, output = record_demo_teleop(record, RECORD_S, 64, *person, params=("record.max_file_duration_s:=5.0",))
    assert code == 0, output[-3000:]
    files = sorted(record.glob("*.mcap"))
    assert len(files) >= 2, files
    return files


@pytest.fixture(scope="module")
def recorded(recording) -> dict[str, np.ndarray]:
    """The recording's frames, in export order: each demonstration's steps the person commanded, from the
    episodes the npz export writes of the same files (read in the order they end, as every export reads them)."""
    from plugrl_ros.record.export import iter_episodes
    from plugrl_ros.record.teleop_export import TeleopEpisodeAssembler

    frames: dict[str, list[np.ndarray]] = {}
    lengths = []
    for episode in iter_episodes(recording, TeleopEpisodeAssembler(), []):
        ep = episode.arrays
        where = np.flatnonzero(ep["step_person"] & ep["step_observed"])
        for run in np.split(where, np.flatnonzero(np.diff(where) != 1) + 1):
            if not len(run):
                continue
            lengths.append(len(run))
            parts = {
                "state": np.concatenate(
                    [ep["observations/states/joints"][run], ep["observations/states/target"][run]], axis=1
                ),
                "action": ep["step_actions"][run],
                "reward": ep["step_rewards"][run],
                "done": ep["step_terminated"][run] | ep["step_truncated"][run],
                "image": ep["observations/images/camera"][run],
            }
            for key, value in parts.items():
                frames.setdefault(key, []).append(value)
    assert len(lengths) >= 4, lengths
    return {**{key: np.concatenate(v) for key, v in frames.items()}, "lengths": np.array(lengths)}


def export(recording: list[Path], out: Path, *args: str) -> subprocess.CompletedProcess:
    command = python_module("plugrl_ros.record.export", "--to", "lerobot", *map(str, recording), "--output", str(out))
    return subprocess.run([*command, *args], check=False, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module", params=["lossless", "av1", "png"])
def dataset(request, recording, tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp(f"lerobot_{request.param}") / "dataset"
    # the parts given last first: the export reads them in the order they were written
    done = export(recording[::-1], out, "--task", TASK, "--video-codec", request.param)
    assert done.returncode == 0, done.stderr
    assert "LeRobot episode(s)" in done.stdout, done.stdout
    return request.param, out


def decoded(path: Path) -> tuple[np.ndarray, list[float]]:
    import av

    with av.open(str(path)) as container:
        frames = list(container.decode(video=0))
    return np.stack([f.to_ndarray(format="rgb24") for f in frames]), [float(f.time) for f in frames]


def png_image(data: bytes) -> np.ndarray:
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        return next(container.decode(video=0)).to_ndarray(format="rgb24")


def test_the_folder_holds_lerobots_v3_layout_with_the_recordings_frames(dataset, recorded):
    import pyarrow.parquet as pq

    codec, root = dataset
    info = json.loads((root / "meta/info.json").read_text())
    n, lengths = len(recorded["action"]), recorded["lengths"]
    assert info["codebase_version"] == "v3.0" and info["fps"] == 20  # the demo's control.rate_hz
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (len(lengths), n, 1)
    features = info["features"]
    assert features["observation.state"]["names"] == STATE_NAMES
    assert features["action"]["shape"] == [2] and features["action"]["names"] == ["arm.0", "arm.1"]
    camera = features["observation.images.camera"]
    assert camera["shape"] == [64, 64, 3]
    if codec == "png":
        assert camera["dtype"] == "image" and info["video_path"] is None and not (root / "videos").exists()
    else:
        assert camera["dtype"] == "video" and camera["info"]["video.codec"] == {"av1": "av1", "lossless": "h264"}[codec]

    data = pq.read_table(root / "data/chunk-000/file-000.parquet").to_pydict()
    assert set(data) == set(features) - ({"observation.images.camera"} if codec != "png" else set())
    np.testing.assert_array_equal(np.array(data["observation.state"]), recorded["state"].astype(np.float32))
    np.testing.assert_array_equal(np.array(data["action"]), recorded["action"].astype(np.float32))
    np.testing.assert_array_equal(np.array(data["next.reward"]), recorded["reward"].astype(np.float32))
    np.testing.assert_array_equal(np.array(data["next.done"]), recorded["done"])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    frame_index = np.concatenate([np.arange(length) for length in lengths])
    assert data["index"] == list(range(n)) and data["frame_index"] == frame_index.tolist()
    assert data["episode_index"] == np.repeat(np.arange(len(lengths)), lengths).tolist()
    np.testing.assert_array_equal(np.array(data["timestamp"]), (frame_index / 20).astype(np.float32))
    assert set(data["task_index"]) == {0}

    tasks = pq.read_table(root / "meta/tasks.parquet").to_pydict()
    assert tasks == {"task": [TASK], "task_index": [0]}
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pydict()
    assert episodes["length"] == lengths.tolist() and episodes["tasks"] == [[TASK]] * len(lengths)
    assert episodes["dataset_from_index"] == starts.tolist()
    assert episodes["dataset_to_index"] == (starts + lengths).tolist()
    if codec != "png":
        assert episodes["videos/observation.images.camera/from_timestamp"] == (starts / 20).tolist()
    assert episodes["stats/action/count"] == [[length] for length in lengths]

    stats = json.loads((root / "meta/stats.json").read_text())
    assert np.allclose(stats["action"]["mean"], recorded["action"].astype(np.float32).mean(axis=0), atol=1e-6)
    assert np.array(stats["observation.images.camera"]["mean"]).shape == (3, 1, 1)

    if codec == "png":
        images = np.stack([png_image(cell["bytes"]) for cell in data["observation.images.camera"]])
    else:
        images, times = decoded(root / "videos/observation.images.camera/chunk-000/file-000.mp4")
        assert np.allclose(times, np.arange(n) / 20)
    assert len(images) == n
    error = np.abs(images.astype(int) - recorded["image"].astype(int))
    if codec != "av1":
        assert error.max() == 0
    else:  # SVT-AV1 at CRF 30, chroma halved: close, not equal
        assert 0 < error.mean() < 8, error.mean()  # 2.8 levels measured on the demo camera


def test_a_recording_without_a_text_observation_needs_a_task_and_an_occupied_folder_is_refused(recording, tmp_path):
    done = export(recording, tmp_path / "no_task")
    assert done.returncode == 2 and "--task" in done.stderr, done.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    done = export(recording, tmp_path / "full", "--task", TASK)
    assert done.returncode == 2 and "not empty" in done.stderr, done.stderr


def test_each_frames_task_is_its_text_observation_when_no_task_is_given(tmp_path):
    from plugrl_ros.lerobot.export import export_lerobot

    def demonstration(texts: list[str]) -> dict[str, np.ndarray]:
        n = len(texts)
        return {
            "observations/states/joints": np.zeros((n, 4)),
            "observations/text": np.array(texts),
            "step_observed": np.ones(n, dtype=bool),
            "step_person": np.ones(n, dtype=bool),
            "step_actions": np.zeros((n, 2)),
            "step_rewards": np.zeros(n),
            "step_terminated": np.zeros(n, dtype=bool),
            "step_truncated": np.zeros(n, dtype=bool),
        }

    import pyarrow.parquet as pq

    recorded = [("teleop", demonstration(["pick", "pick", "place"]), "a"), ("teleop", demonstration(["place"]), "b")]
    counts = export_lerobot(recorded, {"control.rate_hz": 10.0}, tmp_path / "dataset")
    assert (counts.episodes, counts.frames) == (2, 4)
    root = tmp_path / "dataset"
    assert pq.read_table(root / "meta/tasks.parquet").to_pydict() == {"task": ["pick", "place"], "task_index": [0, 1]}
    assert pq.read_table(root / "data/chunk-000/file-000.parquet").column("task_index").to_pylist() == [0, 0, 1, 1]
    assert pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").column("tasks").to_pylist() == [
        ["pick", "place"],
        ["place"],
    ]


@pytest.mark.lerobot
def test_lerobots_own_dataset_reads_every_frame_as_recorded(dataset, recorded):
    pytest.importorskip("lerobot")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    codec, root = dataset
    # torchcodec, LeRobot's first choice, needs FFmpeg's shared libraries on the machine; PyAV brings its own
    loaded = LeRobotDataset("plugrl/demo", root=root, video_backend="pyav")
    n = len(recorded["action"])
    assert len(loaded) == n and loaded.num_episodes == len(recorded["lengths"]) and loaded.fps == 20
    errors = []
    for i in range(n):
        item = loaded[i]
        assert np.array_equal(item["observation.state"].numpy(), recorded["state"][i].astype(np.float32)), i
        assert np.array_equal(item["action"].numpy(), recorded["action"][i].astype(np.float32)), i
        assert item["next.reward"].item() == np.float32(recorded["reward"][i]), i
        assert item["next.done"].item() == recorded["done"][i], i
        assert item["task"] == TASK
        image = (item["observation.images.camera"].numpy().transpose(1, 2, 0) * 255).round().astype(int)
        errors.append(np.abs(image - recorded["image"][i].astype(int)))
    if codec != "av1":
        assert max(int(e.max()) for e in errors) == 0
    else:
        assert 0 < np.mean(errors) < 8, np.mean(errors)

    # what a policy's training reads: its features, the statistics LeRobot aggregates, and action chunks as ACT
    # asks for them (the next 10 steps of the same episode, padded past its end)
    from lerobot.datasets.compute_stats import aggregate_stats
    from lerobot.datasets.utils import dataset_to_policy_features

    policy_features = dataset_to_policy_features(loaded.meta.features)
    assert {"observation.state", "observation.images.camera", "action"} <= set(policy_features)
    both = aggregate_stats([loaded.meta.stats, loaded.meta.stats])
    assert np.allclose(both["action"]["mean"], loaded.meta.stats["action"]["mean"])
    chunked = LeRobotDataset(
        "plugrl/demo", root=root, video_backend="pyav", delta_timestamps={"action": [t / 20 for t in range(10)]}
    )
    last = int(recorded["lengths"][0]) - 1  # the first episode's last frame: 9 of its 10 steps lie beyond it
    item = chunked[last]
    assert item["action"].shape == (10, 2) and item["action_is_pad"].tolist() == [False] + [True] * 9
    assert np.array_equal(item["action"][0].numpy(), recorded["action"][last].astype(np.float32))


def test_lerobots_own_viewer_saves_an_episode_of_the_png_export(dataset, recorded, tmp_path):
    """``lerobot-dataset-viz`` (LeRobot's own visualisation, into a rerun .rrd file) reads an episode whole."""
    pytest.importorskip("lerobot")
    codec, root = dataset
    if codec != "png":
        pytest.skip("the viewer decodes videos with torchcodec, which needs FFmpeg's shared libraries on the machine")
    import shutil
    import sys

    viewer = shutil.which("lerobot-dataset-viz", path=str(Path(sys.executable).parent))
    assert viewer is not None
    command = [viewer, "--repo-id", "plugrl/demo", "--root", str(root), "--episode-index", "1"]
    done = subprocess.run(
        [*command, "--save", "1", "--output-dir", str(tmp_path), "--num-workers", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (saved,) = tmp_path.glob("*.rrd")
    assert saved.stat().st_size > 1000 * int(recorded["lengths"][1])  # its frames' images and values
