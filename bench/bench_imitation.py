"""The imitation loop on the demo reachers, measured: demonstrations, LeRobot's ACT, served, deployed by the bridge.

Run: ``python bench/bench_imitation.py [--quick] [--demo-minutes 5] [--image-size 32] [--steps 2000]
[--batch-size 32] [--episodes 40] [--diffusion] [--rllib-python .venv-rllib/bin/python]
[--output bench-output/imitation] [--json PATH] [--plot PNG]``, in a venv with LeRobot 0.4.4, the ROS 2
wheels and the package with the lerobot extra (docs/recording.md, "For LeRobot"), ``OMP_NUM_THREADS=2``
on a small machine. Every step is a command a user runs:

1. the scripted demonstrator (``plugrl-demo-teleop --minutes 0 --stray 0 --patience 0 --release 0.01``)
   drives the two demo reachers (``plugrl-demo-robot --mode timer --image-size S``) for ``--demo-minutes``
   through a bridge in ``mode: teleop`` that records them (config/demo.yaml and
   config/demo_intervention.yaml);
2. ``plugrl-export --to lerobot --video-codec png`` writes the recording as a LeRobotDataset v3.0
   (lossless images: no AV1 loss in what ACT learns from);
3. LeRobot's own ``lerobot-train`` trains ACT on the CPU (``--diffusion``: Diffusion Policy too);
4. ``plugrl-policy-server --lerobot OUTPUT/checkpoints/last/pretrained_model`` serves the checkpoint, and
   the bridge in ``mode: deploy`` drives the same reachers with it (config/demo.yaml with
   config/demo_lerobot.yaml, which sends the camera too), recording;
5. the same for a random policy (bench/random_policy_server.py) and, with ``--rllib-python`` (Ray and
   LeRobot pin different torch versions, so RLlib runs in a venv of its own), for RLlib's BC trained on
   the same demonstrations (``plugrl-export --to rllib``, bench/imitation_bc.py) and served with
   ``plugrl-policy-server --rllib``.

It reports, per policy, the deployed episodes (the first ``--episodes`` to end, from the deploy bridge's
recording), how many ended on the target (the robot's ``success``), and the mean return and its standard
deviation; and the training's time per step. Steps whose output exists in the output folder are read,
not run again (a benchmark interrupted goes on; delete a folder to redo its step).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import DEMONSTRATOR, ROOT, Child, children, md_table, record_demo_teleop, ros_env, use_own_domain

from plugrl_ros import executables
from plugrl_ros.record.read import in_written_order
from plugrl_ros.shipped import shipped_file

TASK = "reach the target"
DEPLOY_SEED = 7  # the reachers' start and target poses: the same sequence for every policy

# ACT, small enough for a 2-core CPU: one camera of S x S pixels, a ResNet-18 from scratch (no network for
# torchvision's weights), a 256-wide transformer of 2 encoder layers, chunks of 10 steps of which 5 run
ACT_OPTIONS = {
    "policy.chunk_size": "10",
    "policy.n_action_steps": "5",
    "policy.dim_model": "256",
    "policy.dim_feedforward": "1024",
    "policy.n_encoder_layers": "2",
    "policy.n_vae_encoder_layers": "2",
    "policy.optimizer_lr": "1e-4",
    "policy.optimizer_lr_backbone": "1e-4",
    "policy.pretrained_backbone_weights": "null",
}
# Diffusion Policy: one observation (the policy server keeps a history per robot of its requests, one per chunk,
# not one per control step as in training), chunks of 16 steps of which 8 run, a small U-Net, 10 denoising steps
DIFFUSION_OPTIONS = {
    "policy.n_obs_steps": "1",
    "policy.horizon": "16",
    "policy.n_action_steps": "8",
    "policy.down_dims": "[64,128,256]",
    "policy.num_inference_steps": "10",
    "policy.pretrained_backbone_weights": "null",
    "policy.use_group_norm": "true",
    "policy.scheduler_warmup_steps": "100",
}


def child_env() -> dict[str, str]:
    """A child's environment: ours, at most two threads of numeric work, no hub traffic."""
    return ros_env(
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"),
        MKL_NUM_THREADS=os.environ.get("MKL_NUM_THREADS", "2"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        WANDB_MODE="disabled",
    )


def run_logged(command: list[str], log: Path, what: str, timeout: float | None = None) -> str:
    """Run ``command`` to its end, its output into ``log``; its output, or exit saying what failed."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        done = subprocess.run(
            command, check=False, stdout=out, stderr=subprocess.STDOUT, env=child_env(), timeout=timeout
        )
    text = log.read_text()
    if done.returncode != 0:
        sys.exit(f"bench_imitation: {what} failed (exit {done.returncode}); see {log}:\n{text[-3000:]}")
    return text


# -- 1, 2: demonstrations and their export ----------------------------------------


def demonstrations(folder: Path, minutes: float, image_size: int) -> list[Path]:
    """``minutes`` of the scripted demonstrator on the demo reachers in teleop mode, recorded (MCAP files)."""
    recording = folder / "recording"
    if not list(recording.glob("*.mcap")):
        shutil.rmtree(recording, ignore_errors=True)
        started = time.monotonic()
        code = record_demo_teleop(
            recording, 60.0 * minutes, *DEMONSTRATOR, image_size=image_size, seed=100, log=folder / "teleop.log"
        )
        if code != 0:
            sys.exit(f"bench_imitation: the teleop bridge exited with {code}; see {folder / 'teleop.log'}")
        print(f"demonstrations: {60 * minutes:.0f} s recorded in {time.monotonic() - started:.0f} s", flush=True)
    return recording_parts(recording)


def recording_parts(folder: Path) -> list[Path]:
    """A run's MCAP files in the order they were written (``_10`` after ``_9``)."""
    return in_written_order(list(folder.glob("*.mcap")))


def export_lerobot(recording: list[Path], dataset: Path) -> dict[str, int]:
    """The recording as a LeRobotDataset with PNG images; its episodes and frames."""
    if not (dataset / "meta" / "info.json").is_file():
        shutil.rmtree(dataset, ignore_errors=True)
        command = executables.command(
            "plugrl_ros.record.export",
            *("--to", "lerobot", *map(str, recording), "--output", str(dataset)),
            *("--task", TASK, "--video-codec", "png"),
        )
        print(run_logged(command, dataset.parent / "export_lerobot.log", "plugrl-export --to lerobot").strip())
    info = json.loads((dataset / "meta" / "info.json").read_text())
    return {"episodes": info["total_episodes"], "frames": info["total_frames"]}


# -- 3: LeRobot's training ----------------------------------------------------------


def lerobot_train(kind: str, dataset: Path, output: Path, args: argparse.Namespace, steps: int) -> dict[str, Any]:
    """``lerobot-train`` of policy ``kind`` (act, diffusion) for ``steps`` on ``dataset`` into ``output``; what it
    took."""
    model = output / "checkpoints" / "last" / "pretrained_model"
    result_file = output.parent / f"{output.name}_training.json"
    if model.is_dir() and result_file.is_file():
        return json.loads(result_file.read_text())
    shutil.rmtree(output, ignore_errors=True)  # lerobot-train refuses an existing output folder
    options = {
        "policy.type": kind,
        "policy.device": "cpu",
        "policy.push_to_hub": "false",
        "dataset.repo_id": "local/demo",
        "dataset.root": str(dataset),
        "dataset.video_backend": "pyav",
        "output_dir": str(output),
        "steps": str(steps),
        "batch_size": str(args.batch_size),
        "num_workers": "1",
        "log_freq": str(max(1, steps // 20)),
        "save_freq": str(steps),
        "eval_freq": "0",
        "seed": "1000",
        "wandb.enable": "false",
        **(ACT_OPTIONS if kind == "act" else DIFFUSION_OPTIONS),
    }
    if kind == "diffusion":
        crop = (
            args.image_size - args.image_size // 8
        )  # random crops of 7/8 of the picture, as its config crops 84 of 96
        options["policy.crop_shape"] = f"[{crop},{crop}]"
    command = [sys.executable, "-m", "lerobot.scripts.lerobot_train", *(f"--{k}={v}" for k, v in options.items())]
    started = time.monotonic()
    text = run_logged(command, output.parent / f"{output.name}_train.log", f"lerobot-train --policy.type={kind}")
    seconds = time.monotonic() - started
    logged = training_log(text, int(options["log_freq"]))
    result = {
        "policy": kind,
        "steps": steps,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "options": {k: v for k, v in options.items() if k.startswith("policy.")},
        "seconds": round(seconds, 1),
        "update_s_median": statistics.median(u for _, _, u in logged) if logged else None,
        "loss": [[step, loss] for step, loss, _ in logged],
        "model": str(model),
    }
    result_file.write_text(json.dumps(result, indent=1) + "\n")
    return result


def training_log(text: str, log_freq: int) -> list[tuple[int, float, float]]:
    """(step, loss, seconds per update) of each of LeRobot's log lines ("step:2K smpl:64K ep:... loss:0.052 ...
    updt_s:0.312 data_s:0.010"): one every ``log_freq`` steps (its own step count is rounded: 1K, 2K)."""
    found = re.findall(r" step:\S+ .*?loss:([\d.e+-]+) .*?updt_s:([\d.e+-]+)", text)
    return [((i + 1) * log_freq, float(loss), float(update)) for i, (loss, update) in enumerate(found)]


# -- 5: RLlib's BC, in the rllib venv ----------------------------------------------


def behaviour_cloning(recording: list[Path], folder: Path, python: Path, iterations: int) -> dict[str, Any] | None:
    """Export the recording for RLlib and train BC with ``python`` (the rllib venv's); None if it has none."""
    checkpoint = folder / "bc_checkpoint"
    result_file = folder / "bc_training.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    offline = folder / "rllib"
    shutil.rmtree(offline, ignore_errors=True)
    shutil.rmtree(checkpoint, ignore_errors=True)
    export = [
        str(python),
        *("-m", "plugrl_ros.record.export", "--to", "rllib", *map(str, recording)),
        *("--output", str(offline), "--config", str(shipped_file("config", "demo.yaml")), "--images", ""),
    ]
    print(run_logged(export, folder / "export_rllib.log", "plugrl-export --to rllib").strip())
    train = [str(python), str(ROOT / "bench" / "imitation_bc.py"), "--offline", str(offline)]
    train += ["--checkpoint", str(checkpoint), "--iterations", str(iterations)]
    text = run_logged(train, folder / "bc_train.log", "RLlib BC (bench/imitation_bc.py)")
    result = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
    result_file.write_text(json.dumps(result, indent=1) + "\n")
    return result


# -- 4, 5: serving and deploying ----------------------------------------------------


def deploy_params() -> list[Path]:
    """The bridge's params files in deploy mode, in order (the server reads the same): config/demo.yaml, and
    config/demo_lerobot.yaml, which sends the camera too and takes the chunk the server announces."""
    return [shipped_file("config", "demo.yaml"), shipped_file("config", "demo_lerobot.yaml")]


def server_port(server: Child, timeout: float = 180.0) -> int:
    """The port a policy server says it listens on (``listening on ws://HOST:PORT``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(r"listening on wss?://\S+:(\d+)", server.output())
        if match:
            return int(match.group(1))
        if not server.alive():
            break
        time.sleep(0.2)
    raise RuntimeError(f"the policy server did not start:\n{server.output()[-3000:]}")


def deploy(
    name: str, server_command: list[str], folder: Path, args: argparse.Namespace, execution: str = "switch"
) -> dict[str, Any]:
    """Serve a policy and drive two fresh demo reachers with it in deploy mode until ``--episodes`` ended;
    the first ``--episodes`` episodes to end, read from the deploy bridge's recording.

    ``execution``: the bridge's ``policy.execution.mode``. A chunk of one step (BC's) is for the tick its
    observation was taken, so any latency makes it late and ``switch`` drops it: such a policy runs ``sync``
    (the robot waits for each action), as plugrl-demo deploys one."""
    from plugrl_ros.demo.diagnostics import DiagnosticsWatch

    result_file = folder / f"{name}.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    recording = folder / f"{name}_recording"
    shutil.rmtree(recording, ignore_errors=True)
    robot = executables.command(
        "plugrl_ros.demo.robot_node",
        *("--envs", "2", "--mode", "timer", "--image-size", str(args.image_size), "--seed", str(DEPLOY_SEED)),
    )
    watch = DiagnosticsWatch()
    started = time.monotonic()
    status = None
    try:
        with children() as started_children:
            server = Child(server_command, env=child_env())
            started_children.append(server)
            port = server_port(server)
            started_children.append(Child(robot, env=child_env()))
            bridge = executables.command(
                "plugrl_ros.node.bridge_main",
                "--ros-args",
                *[arg for path in deploy_params() for arg in ("--params-file", str(path))],
                *("-p", "mode:=deploy", "-p", "control.mode:=timer", "-p", f"policy.uri:=ws://127.0.0.1:{port}"),
                *("-p", f"policy.execution.mode:={execution}", "-p", f"record.path:={recording}"),
            )
            bridge_child = Child(bridge, env=child_env())
            started_children.append(bridge_child)
            timeout = 60.0 + 6.0 * args.episodes  # an episode lasts 3 s at most, and two reachers run
            deadline = time.monotonic() + timeout
            while True:
                status = watch.deploy
                if status is not None and status.episodes >= args.episodes:
                    break
                for child in started_children:
                    if not child.alive():
                        raise RuntimeError(f"{name}: {child.command[-6:]} exited:\n{child.output()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{name}: {args.episodes} episodes did not end in {timeout:g} s (ended: "
                        f"{status.episodes if status else 0}); see {recording} (plugrl-record-info)"
                    )
                time.sleep(0.5)
            (folder / f"{name}_server.log").write_text(server.output())
            (folder / f"{name}_bridge.log").write_text(bridge_child.output())
    finally:
        watch.close()
    result = {
        **episode_figures(name, ended_episodes(recording_parts(recording))[: args.episodes]),
        "request_latency_median_ms": status.latency_ms if status else None,
        "idle_steps_at_boundaries": status.idle_steps if status else None,
        "seconds": round(time.monotonic() - started, 1),
    }
    result_file.write_text(json.dumps(result, indent=1) + "\n")
    return result


def episode_figures(name: str, episodes: list[tuple[float, int, bool]]) -> dict[str, Any]:
    """Episodes' count, successes, return (mean, standard deviation, each) and mean length."""
    if not episodes:
        raise RuntimeError(f"{name}: no episode ended")
    returns = [r for r, _, _ in episodes]
    return {
        "policy": name,
        "episodes": len(episodes),
        "successes": sum(s for _, _, s in episodes),
        "success_rate": sum(s for _, _, s in episodes) / len(episodes),
        "mean_return": statistics.fmean(returns),
        "sd_return": statistics.stdev(returns) if len(returns) > 1 else 0.0,
        "mean_length": statistics.fmean(n for _, n, _ in episodes),
        "returns": returns,
    }


def ended_episodes(paths: list[Path]) -> list[tuple[float, int, bool]]:
    """Every episode the recording saw end, in the order they ended (both reachers): (return, length, success)."""
    from plugrl_ros.record import channels
    from plugrl_ros.record.read import labelled, read_all

    ended = []
    for _, rec in read_all(paths):
        per_env = channels.split_env_topic(rec.topic)
        if per_env is not None and per_env[1] == "episode":
            ep = labelled(rec.msg)
            ended.append((rec.log_time, float(ep["return"]), int(ep["length"]), bool(ep["success"])))
    ended.sort()
    return [(r, n, s) for _, r, n, s in ended]


def lerobot_server(model: str) -> list[str]:
    config = [str(p) for p in deploy_params()]
    return executables.command("plugrl_ros.tools.policy_server", "--lerobot", model, "--config", *config, "--port", "0")


def rllib_server(python: Path, checkpoint: str) -> list[str]:
    config = [str(p) for p in deploy_params()]
    server = ("-m", "plugrl_ros.tools.policy_server", "--rllib", checkpoint, "--config", *config, "--port", "0")
    return [str(python), *server]


def random_server(horizon: int) -> list[str]:
    return [sys.executable, str(ROOT / "bench" / "random_policy_server.py"), "--horizon", str(horizon), "--port", "0"]


# -- the run ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 40 s of demonstrations, 100 ACT steps, 10 episodes"
    )
    parser.add_argument("--demo-minutes", type=float, default=5.0, help="minutes of demonstrations recorded")
    parser.add_argument("--image-size", type=int, default=32, help="the demo camera's pictures, pixels square")
    parser.add_argument("--steps", type=int, default=2000, help="lerobot-train's --steps")
    parser.add_argument("--diffusion-steps", type=int, help="lerobot-train's --steps for Diffusion Policy (--steps)")
    parser.add_argument("--batch-size", type=int, default=32, help="lerobot-train's --batch_size")
    parser.add_argument("--episodes", type=int, default=40, help="deployed episodes per policy")
    parser.add_argument("--bc-iterations", type=int, default=60, help="RLlib BC's training iterations")
    parser.add_argument("--diffusion", action="store_true", help="also train and deploy Diffusion Policy")
    parser.add_argument(
        "--rllib-python",
        type=Path,
        default=ROOT / ".venv-rllib" / "bin" / "python",
        help="a python with the rllib extra, for the BC arm (default %(default)s; missing: the arm is skipped)",
    )
    parser.add_argument("--output", type=Path, default=Path("bench-output/imitation"))
    parser.add_argument("--json", type=Path, help="write the table's figures here")
    parser.add_argument("--plot", type=Path, help="draw the deployed returns and success rates here")
    args = parser.parse_args(argv)
    # Ctrl-C and SIGTERM stop the children (newest first) on the way out, also when started in the background
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.quick:
        args.demo_minutes, args.steps, args.batch_size, args.episodes, args.bc_iterations = 40 / 60, 100, 16, 10, 10
    use_own_domain()
    args.output = args.output.resolve()
    out = args.output

    recording = demonstrations(out / "demonstrations", args.demo_minutes, args.image_size)
    dataset = export_lerobot(recording, out / "lerobot")
    print(f"dataset: {dataset['episodes']} demonstrations, {dataset['frames']} frames", flush=True)
    trained = {"act": lerobot_train("act", out / "lerobot", out / "act", args, args.steps)}
    if args.diffusion:
        steps = args.diffusion_steps or args.steps
        trained["diffusion"] = lerobot_train("diffusion", out / "lerobot", out / "diffusion", args, steps)
    for kind, t in trained.items():
        print(f"{kind}: {t['steps']} steps of {t['batch_size']} in {t['seconds']:.0f} s", flush=True)
    bc = None
    if args.rllib_python.is_file():
        bc = behaviour_cloning(recording, out / "bc", args.rllib_python, args.bc_iterations)
    else:
        print(
            f"the BC arm is skipped: {args.rllib_python} does not exist (--rllib-python: a python with the "
            "rllib extra)",
            flush=True,
        )

    # every server announces its chunk (ACT's n_action_steps, BC's one step); the random one ACT's
    horizon = int(ACT_OPTIONS["policy.n_action_steps"])
    results: dict[str, dict[str, Any] | None] = {}
    # the reference: the demonstrator's own first episodes in the teleop recording (its bridge counted them alike)
    demonstrator = episode_figures("demonstrator", ended_episodes(recording)[: args.episodes])
    results["scripted demonstrator (recorded)"] = {**demonstrator, "request_latency_median_ms": None}
    results["ACT (LeRobot)"] = deploy("act", lerobot_server(trained["act"]["model"]), out / "deploy", args)
    if "diffusion" in trained:
        model = trained["diffusion"]["model"]
        results["Diffusion Policy (LeRobot)"] = deploy("diffusion", lerobot_server(model), out / "deploy", args)
    results["BC (RLlib)"] = (
        None
        if bc is None
        else deploy("bc", rllib_server(args.rllib_python, bc["checkpoint"]), out / "deploy", args, "sync")
    )
    results["random"] = deploy("random", random_server(horizon), out / "deploy", args)

    rows = []
    for name, r in results.items():
        if r is None:
            rows.append([name, "-", "skipped: no --rllib-python", "-", "-"])
            continue
        rows.append(
            [
                name,
                r["episodes"],
                f"{r['success_rate']:.0%} ({r['successes']})",
                f"{r['mean_return']:.2f} ± {r['sd_return']:.2f}",
                "-" if r["request_latency_median_ms"] is None else f"{r['request_latency_median_ms']:.1f}",
            ]
        )
    print(
        f"\nThe imitation loop on the demo reachers (timer, 20 Hz): {dataset['episodes']} demonstrations "
        f"({args.demo_minutes:g} min, {dataset['frames']} frames, {args.image_size} px camera)"
    )
    for kind, t in trained.items():
        step = t["update_s_median"]
        print(
            f"{kind}: lerobot-train {t['steps']} steps of batch {t['batch_size']}, {t['seconds']:.0f} s"
            + ("" if step is None else f" ({step:.2f} s per update)")
        )
    if bc is not None:
        print(f"BC: {bc['iterations']} RLlib iterations, {bc['seconds']:.0f} s")
    print(md_table(["policy", "episodes", "success rate", "mean return ± sd", "request latency ms"], rows))
    table = {"dataset": dataset, "demo_minutes": args.demo_minutes, "training": trained, "bc": bc, "results": results}
    if args.json:
        args.json.write_text(json.dumps(table, indent=1) + "\n")
    if args.plot:
        plot(table, args.plot)
    return 0


def plot(table: dict[str, Any], path: Path) -> None:
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = {name: r for name, r in table["results"].items() if r is not None}
    names = list(shown)
    labels = [textwrap.fill(name, 14) for name in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), width_ratios=[3, 2])
    left.boxplot([shown[n]["returns"] for n in names], showmeans=True)
    left.set_xticks(range(1, len(names) + 1), labels, fontsize=8)
    left.set_ylabel("episode return")
    left.set_title(f"on the demo reachers, {min(r['episodes'] for r in shown.values())} episodes each")
    right.bar(range(len(names)), [shown[n]["success_rate"] for n in names], color="tab:green")
    right.set_xticks(range(len(names)), labels, fontsize=8)
    right.set_ylim(0, 1)
    right.set_ylabel("episodes ending on the target")
    dataset = table["dataset"]
    fig.suptitle(f"imitation from {dataset['episodes']} scripted demonstrations ({dataset['frames']} frames)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
