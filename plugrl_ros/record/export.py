"""``plugrl-export FILE... --to npz --output OUT``: one ``.npz`` per finished episode, for offline RL and imitation.

A train-mode recording is rebuilt by :mod:`plugrl_ros.record.train_export` (its
docstring says what each episode file holds), a deploy-mode one (no feedback,
chunks blended or cut short by the next) by :mod:`plugrl_ros.record.deploy_export`,
a teleop-mode one (a person's demonstrations) by :mod:`plugrl_ros.record.teleop_export`,
chosen from the configuration recorded at the start.

``--to rllib --output OUT --config robot.yaml`` writes the episodes of a train or teleop
recording as RLlib's offline data instead (:mod:`plugrl_ros.rllib.offline`;
the rllib extra), with the widths the recording holds.

``--to lerobot --output OUT`` writes them as a LeRobotDataset v3.0 folder
(:mod:`plugrl_ros.lerobot.export`; the lerobot extra), with the widths, names
and rate the recording holds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from plugrl_ros.record import channels
from plugrl_ros.record.deploy_export import DeployEpisodeAssembler
from plugrl_ros.record.episode_parts import EpisodeArrays
from plugrl_ros.record.read import RecordingReader, in_written_order
from plugrl_ros.record.teleop_export import TeleopEpisodeAssembler
from plugrl_ros.record.train_export import EpisodeAssembler


def recorded_parameters(path: Path) -> dict[str, Any]:
    """The bridge's parameters, from the configuration that opens every recording ({} if it is missing)."""
    for rec in RecordingReader(path):
        if rec.topic == channels.CONFIG_TOPIC:
            return dict(json.loads(rec.msg.data).get("parameters", {}))
        break
    return {}


def recorded_mode(path: Path) -> str:
    """The bridge's mode (``train``, ``deploy`` or ``teleop``), from the configuration that opens every recording."""
    return str(recorded_parameters(path).get("mode", "train"))


def assembler_for(mode: str) -> Any:
    """The assembler for a recording of a bridge in ``mode`` (train, deploy or teleop)."""
    if mode == "deploy":
        return DeployEpisodeAssembler()
    if mode == "teleop":
        return TeleopEpisodeAssembler()
    return EpisodeAssembler()


def iter_episodes(paths: list[Path], assembler: Any, readers: list[RecordingReader]) -> Iterator[EpisodeArrays]:
    """Every finished episode of a recording (the parts of a rotated run, in order), as it is rebuilt.

    ``readers`` collects each file's reader, to tell afterwards whether a file was cut off.
    """
    for path in paths:
        reader = RecordingReader(path)
        readers.append(reader)
        for rec in reader:
            yield from assembler.feed(rec)
    yield from assembler.finish()


USAGE = "Write it as: plugrl-export FILE.mcap... --to FORMAT --output DIR"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plugrl-export",
        description="Export a plugrl_ros recording's episodes as arrays (npz), as RLlib offline data (rllib) or as "
        "a LeRobotDataset (lerobot).",
    )
    parser.add_argument(
        "files", nargs="*", type=Path, help="MCAP files (a rotated run's parts: read in the order written)"
    )
    parser.add_argument(
        "--to",
        nargs="+",
        metavar="FORMAT",
        required=True,
        help="'npz' (one .npz per episode), 'rllib' (episodes RLlib's offline_data reads) or 'lerobot' (a "
        "LeRobotDataset v3.0 folder); the files may follow it (plugrl-export --to rllib run_*.mcap --output DIR)",
    )
    parser.add_argument("--output", type=Path, help="the folder to write into")
    rllib = parser.add_argument_group("--to rllib: the runner's spaces (as plugrl_ros.rllib.robot_spaces builds them)")
    rllib.add_argument("--config", type=Path, help="the bridge's params file the runner builds its spaces from")
    rllib.add_argument(
        "--horizon",
        type=int,
        help="H, control steps per RL step (the runner's; default: a train recording's chunk, 1 for teleop)",
    )
    rllib.add_argument(
        "--states", help="comma-separated states the policy reads (default: every one configured and recorded)"
    )
    rllib.add_argument(
        "--images", help="comma-separated images the policy reads (default: every one configured and recorded)"
    )
    rllib.add_argument(
        "--state-dims", nargs="*", default=[], metavar="NAME=N", help="widths (default: the recording's)"
    )
    rllib.add_argument("--action-dim", type=int, help="one step's action width (default: the recording's)")
    rllib.add_argument(
        "--no-normalize-actions",
        dest="normalize_actions",
        action="store_false",
        help="store actions in action units (RLlib's normalize_actions=False); default: normalised as the module's",
    )
    lerobot = parser.add_argument_group("--to lerobot")
    lerobot.add_argument("--task", help="every frame's task (default: the recording's text observation)")
    lerobot.add_argument(
        "--video-codec",
        choices=("av1", "lossless", "png"),
        default="av1",
        help="'av1': videos as LeRobot writes them by default (SVT-AV1, yuv420p, CRF 30; small, lossy); "
        "'lossless': videos in H.264 RGB, quantiser 0 (every pixel as recorded, several times larger); 'png': no "
        "videos, each image a PNG in its frame's Parquet row (LeRobot's image features; lossless, largest)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    fmt, *rest = args.to
    # --to FORMAT may be followed by the files (argparse hands them to --to), or, in the older form, by the folder
    folders: list[Path] = []
    for value in map(Path, rest):
        (args.files if value.suffix == ".mcap" or value.is_file() else folders).append(value)
    if len(folders) > 1:
        parser.error(f"--to takes one format; {', '.join(map(str, folders))}: not MCAP files. {USAGE}")
    out = folders[0] if folders else args.output
    if fmt not in ("npz", "rllib", "lerobot"):
        parser.error(f"--to: format {fmt!r} is not supported; supported: npz, rllib, lerobot")
    if not args.files:
        parser.error(f"give the recording's MCAP files. {USAGE}")
    if out is None:
        parser.error(f"give the folder to write into with --output. {USAGE}")
    if folders and args.output is not None and args.output != out:
        parser.error(f"two output folders: {out} (--to) and {args.output} (--output)")
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    args.files = in_written_order(args.files)  # a shell's *.mcap puts a run's part _10 before _2
    mode = recorded_mode(args.files[0])
    if fmt == "rllib":
        return _export_rllib(parser, args, mode, out)
    if fmt == "lerobot":
        return _export_lerobot(parser, args, mode, out)
    out.mkdir(parents=True, exist_ok=True)
    assembler = assembler_for(mode)
    readers: list[RecordingReader] = []
    written = incomplete = 0
    for ep in iter_episodes(args.files, assembler, readers):  # written one by one: frames add up
        np.savez(out / f"env{ep.env}_episode{ep.index:05d}.npz", **ep.arrays)
        written += 1
        incomplete += not bool(ep.arrays["complete"])
    _report(readers, assembler, mode)
    print(
        f"wrote {written} episode(s) to {out}"
        + (f" ({incomplete} marked incomplete: the recorder dropped calls during them)" if incomplete else "")
    )
    return 0


def _report(readers: list[RecordingReader], assembler: Any, mode: str) -> None:
    for reader in readers:
        if reader.problem:
            print(f"{reader.path}: {reader.problem}", file=sys.stderr)
    if getattr(assembler, "abandoned", 0):
        print(f"{assembler.abandoned} episode(s) were ended by a lost connection before their end (not exported)")
    if assembler.unfinished:
        exported = "exported with finished = false" if mode == "deploy" else "not exported"
        print(f"{assembler.unfinished} episode(s) were still running when the recording ended ({exported})")
    for reason in assembler.skipped:
        print(f"skipped {reason}", file=sys.stderr)


def _export_rllib(parser: argparse.ArgumentParser, args: argparse.Namespace, mode: str, out: Path) -> int:
    if args.config is None:
        parser.error("--to rllib: --config names the params file the runner builds its spaces from")
    if mode == "deploy":
        parser.error(
            "--to rllib: a deploy-mode recording's chunks are blended or cut short by the next one, so its RL "
            "steps are not the runner's; export train or teleop recordings (or --to npz for this one)"
        )
    try:
        from plugrl_ros.params.section import ConfigError
        from plugrl_ros.rllib.offline import export_rllib
        from plugrl_ros.serve.spaces import robot_spaces
    except ImportError as exc:
        print(
            f"plugrl-export: --to rllib needs the rllib extra (pip install 'plugrl_ros[rllib]'): {exc}", file=sys.stderr
        )
        return 2
    dims: dict[str, int] = {}
    for item in args.state_dims:
        name, _, width = item.partition("=")
        if not width.isdigit():
            parser.error(f"--state-dims: {item!r} is not NAME=N")
        dims[name] = int(width)
    assembler = assembler_for(mode)
    readers: list[RecordingReader] = []
    episodes = iter_episodes(args.files, assembler, readers)
    first = next(episodes, None)
    if first is None:
        _report(readers, assembler, mode)
        print("plugrl-export: the recording holds no finished episode to export", file=sys.stderr)
        return 2
    # what the recording itself says: each observation's shape, the chunk's horizon, one step's action width
    shapes = {
        key.partition("/")[2]: value.shape[1:] for key, value in first.arrays.items() if key.startswith("observations/")
    }
    actions = first.arrays["actions" if mode == "train" else "step_actions"]
    horizon = args.horizon if args.horizon is not None else (int(actions.shape[1]) if mode == "train" else 1)
    action_dim = args.action_dim if args.action_dim is not None else int(actions.shape[-1])
    try:
        names = {
            group: None if given is None else [n for n in given.split(",") if n]
            for group, given in (("states", args.states), ("images", args.images))
        }
        spaces = robot_spaces(
            args.config, horizon=horizon, state_dims=dims, action_dim=action_dim, recorded=shapes, **names
        )
    except (ConfigError, ValueError, OSError) as exc:
        print(f"plugrl-export: {args.config}: {exc}", file=sys.stderr)
        return 2
    recorded = ((mode, ep.arrays, f"env {ep.env} episode {ep.index}") for ep in itertools.chain([first], episodes))
    counts = export_rllib(recorded, spaces, out, normalize_actions=args.normalize_actions)
    _report(readers, assembler, mode)
    for reason in counts.skipped:
        print(f"skipped {reason}", file=sys.stderr)
    print(
        f"wrote {counts.episodes} RLlib episode(s), {counts.steps} RL step(s) of H = {horizon} "
        f"({counts.intervened_steps} commanded by a person) to {out}: "
        f"config.offline_data(input_=[{str(out)!r}], input_read_episodes=True)"
    )
    return 0


def _export_lerobot(parser: argparse.ArgumentParser, args: argparse.Namespace, mode: str, out: Path) -> int:
    if out.exists() and any(out.iterdir()):
        parser.error(f"--to lerobot: {out} is not empty; a dataset is written into a new folder")
    try:
        from plugrl_ros.lerobot.export import export_lerobot
    except ImportError as exc:
        print(
            f"plugrl-export: --to lerobot needs the lerobot extra (pip install 'plugrl_ros[lerobot]'): {exc}",
            file=sys.stderr,
        )
        return 2
    assembler = assembler_for(mode)
    readers: list[RecordingReader] = []
    recorded = (
        (mode, ep.arrays, f"env {ep.env} episode {ep.index}") for ep in iter_episodes(args.files, assembler, readers)
    )
    try:
        counts = export_lerobot(recorded, recorded_parameters(args.files[0]), out, args.task, args.video_codec)
    except ValueError as exc:
        print(f"plugrl-export: --to lerobot: {exc}", file=sys.stderr)
        return 2
    _report(readers, assembler, mode)
    for reason in counts.skipped:
        print(f"skipped {reason}", file=sys.stderr)
    if not counts.episodes:
        print("plugrl-export: the recording holds no episode with LeRobot frames to export", file=sys.stderr)
        return 2
    print(
        f"wrote {counts.episodes} LeRobot episode(s), {counts.frames} frame(s) to {out}: "
        f"LeRobotDataset(repo_id, root={str(out)!r})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
