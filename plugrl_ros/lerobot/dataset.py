"""A LeRobotDataset v3.0 folder, written with pyarrow and PyAV (LeRobot itself reads it back).

The layout LeRobot 0.4 reads (``LeRobotDataset(repo_id, root=DIR)``)::

    meta/info.json                         codebase v3.0, fps, features (dtype, shape, names; a video's info)
    meta/stats.json                        per feature: min, max, mean, std, count, q01 ... q99
    meta/tasks.parquet                     the tasks (the index) and their task_index
    meta/episodes/chunk-000/file-000.parquet
                                           per episode: its tasks, length, its rows in data/ and its span of
                                           each video, its statistics (stats/<feature>/<stat>)
    data/chunk-000/file-000.parquet        one row per frame: every feature but the videos
    videos/<key>/chunk-000/file-000.mp4    one stream per camera, the episodes one after the other (or, with
                                           images as PNG, none: each frame's PNG is in its data/ row)

Numbers are float32, the width LeRobot hands them to a policy in: a frame's
state, action and reward are the recording's, rounded to float32.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from plugrl_ros.lerobot.frames import Frames
from plugrl_ros.lerobot.stats import aggregate, image_stats, vector_stats
from plugrl_ros.lerobot.video import Codec, VideoStream, png

CODEBASE_VERSION = "v3.0"
CHUNK_FILE = "chunk-000/file-000"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
STATE, ACTION, REWARD, DONE = "observation.state", "action", "next.reward", "next.done"
INDEX_FEATURES = {  # LeRobot's own, in every dataset
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


def image_key(name: str) -> str:
    return f"observation.images.{name}"


@dataclass
class Layout:
    """What every frame holds, from the recording: the states (in this order) and their element names, the
    action's element names, the images, the rate."""

    fps: int
    state_names: dict[str, list[str]]
    action_names: list[str]
    images: list[str]
    codec: Codec | None  # None: images as PNG in the Parquet (LeRobot's "image" features), not as videos


@dataclass
class _Columns:
    values: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, key: str, value: np.ndarray) -> None:
        self.values.setdefault(key, []).append(value)

    def array(self, key: str) -> np.ndarray:
        return np.concatenate(self.values[key])


class LeRobotWriter:
    """Writes episodes into ``root`` as they come (videos stream to disk); :meth:`close` writes the rest."""

    def __init__(self, root: Path, layout: Layout) -> None:
        self.root = root
        self.layout = layout
        self.frames = 0
        self.episodes: list[dict[str, Any]] = []
        self.tasks: dict[str, int] = {}
        self._columns = _Columns()
        self._image_stats: dict[str, list[dict[str, np.ndarray]]] = {name: [] for name in layout.images}
        codec = layout.codec
        self._videos = {
            name: VideoStream(
                root / VIDEO_PATH.format(video_key=image_key(name), chunk_index=0, file_index=0), layout.fps, codec
            )
            for name in (layout.images if codec is not None else [])
        }
        self._pngs: dict[str, list[bytes]] = {name: [] for name in (layout.images if codec is None else [])}
        self._image_shapes: dict[str, tuple[int, ...]] = {}

    def add(self, frames: Frames) -> None:
        """One episode."""
        n, index = len(frames), len(self.episodes)
        state = np.concatenate([frames.states[name].reshape(n, -1) for name in self.layout.state_names], axis=1)
        widths = {name: frames.states[name].reshape(n, -1).shape[1] for name in self.layout.state_names}
        expected = {name: len(names) for name, names in self.layout.state_names.items()}
        if widths != expected or frames.action.shape[1] != len(self.layout.action_names):
            raise ValueError(
                f"its states are {widths} wide and its action {frames.action.shape[1]}; the recording's first "
                f"episode's were {expected} and {len(self.layout.action_names)}"
            )
        task_index = np.array([self.tasks.setdefault(text, len(self.tasks)) for text in frames.text], dtype=np.int64)
        columns = {
            STATE: state.astype(np.float32),
            ACTION: frames.action.astype(np.float32),
            REWARD: frames.reward.astype(np.float32),
            DONE: frames.done.astype(bool),
            "timestamp": (np.arange(n) / self.layout.fps).astype(np.float32),
            "frame_index": np.arange(n, dtype=np.int64),
            "episode_index": np.full(n, index, dtype=np.int64),
            "index": np.arange(self.frames, self.frames + n, dtype=np.int64),
            "task_index": task_index,
        }
        record: dict[str, Any] = {
            "episode_index": index,
            "tasks": sorted(set(frames.text), key=lambda t: self.tasks[t]),
            "length": n,
            "data/chunk_index": 0,
            "data/file_index": 0,
            "dataset_from_index": self.frames,
            "dataset_to_index": self.frames + n,
        }
        stats = {key: vector_stats(value) for key, value in columns.items()}
        for name in self._pngs:
            images = frames.images[name]
            shape = self._image_shapes.setdefault(name, images.shape[1:])
            if images.shape[1:] != shape:
                raise ValueError(f"its {name} images are {list(images.shape[1:])}, the first episode's {list(shape)}")
            self._pngs[name].extend(png(image) for image in images)
            stats[image_key(name)] = image_stats(images)
            self._image_stats[name].append(stats[image_key(name)])
        for name in self._videos:
            video = self._videos[name]
            start = video.frames
            video.write(frames.images[name])
            record[f"videos/{image_key(name)}/chunk_index"] = 0
            record[f"videos/{image_key(name)}/file_index"] = 0
            record[f"videos/{image_key(name)}/from_timestamp"] = start / self.layout.fps
            record[f"videos/{image_key(name)}/to_timestamp"] = video.frames / self.layout.fps
            stats[image_key(name)] = image_stats(frames.images[name])
            self._image_stats[name].append(stats[image_key(name)])
        record["meta/episodes/chunk_index"] = 0
        record["meta/episodes/file_index"] = 0
        for key, values in stats.items():
            for stat, value in values.items():
                record[f"stats/{key}/{stat}"] = value.tolist()
        for key, value in columns.items():
            self._columns.add(key, value)
        self.episodes.append(record)
        self.frames += n

    def close(self) -> None:
        """Closes the videos and writes the frames, the episodes, the tasks, the statistics and the info."""
        for video in self._videos.values():
            video.close()
        if not self.episodes:
            return
        self._write_data()
        pq.write_table(
            pa.Table.from_pylist(self.episodes), _made(self.root / "meta/episodes" / f"{CHUNK_FILE}.parquet")
        )
        self._write_tasks()
        stats = {key: vector_stats(self._columns.array(key)) for key in self._columns.values}
        for name, parts in self._image_stats.items():
            stats[image_key(name)] = aggregate(parts)
        plain = {key: {stat: value.tolist() for stat, value in values.items()} for key, values in stats.items()}
        _made(self.root / "meta/stats.json").write_text(json.dumps(plain, indent=4))
        _made(self.root / "meta/info.json").write_text(json.dumps(self.info(), indent=4))

    def features(self) -> dict[str, dict[str, Any]]:
        names = [n for names in self.layout.state_names.values() for n in names]
        out: dict[str, dict[str, Any]] = {
            STATE: {"dtype": "float32", "shape": [len(names)], "names": names},
            ACTION: {"dtype": "float32", "shape": [len(self.layout.action_names)], "names": self.layout.action_names},
            REWARD: {"dtype": "float32", "shape": [1], "names": None},
            DONE: {"dtype": "bool", "shape": [1], "names": None},
        }
        for name, shape in self._image_shapes.items():
            out[image_key(name)] = {"dtype": "image", "shape": list(shape), "names": ["height", "width", "channels"]}
        for name, video in self._videos.items():
            h, w, c = video.shape
            out[image_key(name)] = {
                "dtype": "video",
                "shape": [h, w, c],
                "names": ["height", "width", "channels"],
                "info": video.info(),
            }
        return {**out, **INDEX_FEATURES}

    def info(self) -> dict[str, Any]:
        return {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": None,
            "total_episodes": len(self.episodes),
            "total_frames": self.frames,
            "total_tasks": len(self.tasks),
            "chunks_size": 1000,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": self.layout.fps,
            "splits": {"train": f"0:{len(self.episodes)}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if self._videos else None,
            "features": self.features(),
        }

    def _write_data(self) -> None:
        fields, arrays = [], []
        for key, feature in {k: v for k, v in self.features().items() if v["dtype"] != "video"}.items():
            if feature["dtype"] == "image":  # as the datasets library stores an Image: {bytes, path}
                kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
                pngs = self._pngs[key.removeprefix("observation.images.")]
                arrays.append(pa.array([{"bytes": b, "path": None} for b in pngs], type=kind))
                fields.append(pa.field(key, kind))
                continue
            values = self._columns.array(key)
            scalar = pa.from_numpy_dtype(values.dtype)
            if feature["shape"] == [1]:
                arrays.append(pa.array(values.reshape(-1), type=scalar))
                fields.append(pa.field(key, scalar))
            else:  # a fixed-size list, as LeRobot's Sequence(length=d) features are stored
                width = values.shape[1]
                arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), type=scalar), width))
                fields.append(pa.field(key, pa.list_(scalar, width)))
        pq.write_table(
            pa.Table.from_arrays(arrays, schema=pa.schema(fields)),
            _made(self.root / DATA_PATH.format(chunk_index=0, file_index=0)),
        )

    def _write_tasks(self) -> None:
        # a pandas DataFrame indexed by the task, as LeRobot reads it back (pandas.read_parquet); the index is
        # named in the pandas metadata, so no pandas is needed to write it
        tasks = sorted(self.tasks, key=self.tasks.get)
        table = pa.table(
            {"task": pa.array(tasks, pa.string()), "task_index": pa.array([self.tasks[t] for t in tasks], pa.int64())}
        )
        pandas_meta = {
            "index_columns": ["task"],
            "column_indexes": [],
            "columns": [
                {
                    "name": "task_index",
                    "field_name": "task_index",
                    "pandas_type": "int64",
                    "numpy_type": "int64",
                    "metadata": None,
                },
                {
                    "name": "task",
                    "field_name": "task",
                    "pandas_type": "unicode",
                    "numpy_type": "object",
                    "metadata": None,
                },
            ],
            "creator": {"library": "pyarrow", "version": pa.__version__},
            "pandas_version": "2.2.3",
        }
        table = table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
        pq.write_table(table, _made(self.root / "meta/tasks.parquet"))


def _made(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
