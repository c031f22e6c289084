"""What latency a robot can tolerate: env-step rate and idle fraction versus round-trip time and packet loss.

Run: ``python bench/bench_network.py [--quick] [--seconds S] [--json PATH]``.

The probe robot and the bridge (as ``plugrl-probe`` runs them: two ROS
processes, one env) step against ``bench_trainer.py`` through the relay of
test/netem.py, which adds a round-trip time (split evenly between the two
directions) on loopback; the trainer itself answers at once. For each chunk
length H (1, 10, 50), with and without ``reuse-feedback-obs``, in lockstep and
in timer mode (50 Hz), the round-trip time steps through 0, 50, 150 and 300 ms
on one running bridge, and the trainer counts env steps over a window.

Idle fraction: in timer mode, the share of the 50 Hz ticks on which the
robot had no action (1 - rate / 50); in lockstep mode, the share of the
no-delay rate lost to waiting (1 - rate / rate at 0 ms, same run).

Packet loss (as root, with network namespaces of our own: iptables statistic
DROP on both directions, no added delay) is measured for H = 10 with reuse.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "test"))

import common
from netem import NetnsLink, Relay, netns_unavailable

ACTION_DIM = 2
RATE_HZ = 50.0
RTTS_MS = (0, 50, 150, 300)
HORIZONS = (1, 10, 50)
LOSSES = (0.0, 0.01, 0.05)


def probe_children(uri: str, mode: str, reuse: bool, prefix: list[str]) -> list[list[str]]:
    from plugrl_ros.shipped import shipped_file
    from plugrl_ros.tools.probe import build_parser
    from plugrl_ros.tools.probe_deployment import bridge_command

    robot = common.python_module(
        "plugrl_ros.tools.probe_robot", "--envs", "1", "--action-dim", str(ACTION_DIM), "--episode-steps", "1000"
    )
    options = build_parser().parse_args(
        ["--server", uri, "--envs", "1", "--mode", mode, "--rate", f"{RATE_HZ}", "--quiet"]
        + ["--action-dim", str(ACTION_DIM)]
        + ([] if reuse else ["--no-reuse"])
    )
    bridge = bridge_command(options, str(shipped_file("config", "probe.yaml")), "plugrl_bridge")
    return [prefix + robot, prefix + bridge]


def measure(trainer: common.TrainerChild, seconds: float, settle: float) -> float:
    time.sleep(settle)  # let chunks started before the change drain
    before = trainer.stats()
    time.sleep(seconds)
    after = common.difference(trainer.stats(), before)
    return after["steps"] / after["t"] if after["t"] > 0 else float("nan")


def run_rtt_group(horizon: int, reuse: bool, mode: str, rtts: tuple[int, ...], seconds: float) -> list[dict]:
    rows = []
    with common.children() as started:
        trainer = common.TrainerChild("--horizon", str(horizon), "--action-dim", str(ACTION_DIM), "--reuse")
        started.append(trainer)
        relay = Relay("127.0.0.1", trainer.port)
        relay.start()
        try:
            clients = [common.Child(c) for c in probe_children(relay.uri, mode, reuse, [])]
            started.extend(clients)
            common.wait_for(lambda: trainer.stats()["steps"] > 2, 60.0, "the bridge's first steps")
            for rtt in rtts:
                relay.rtt_s = rtt / 1000
                # steps are counted per feedback: a window of at least 8 chunks keeps the count's granularity small
                chunk_s = horizon / RATE_HZ + rtt / 1000
                rate = measure(trainer, max(seconds, 8 * chunk_s), settle=1.0 + 2 * chunk_s)
                rows.append(
                    {"horizon": horizon, "reuse": reuse, "mode": mode, "rtt_ms": rtt, "loss": 0.0, "rate": rate}
                )
            for client in clients:
                if not client.alive():
                    raise RuntimeError("a probe process exited:\n" + client.output()[-3000:])
        finally:
            relay.stop()
    return _with_idle(rows)


def run_loss_group(mode: str, losses: tuple[float, ...], seconds: float) -> list[dict]:
    rows = [
        {"horizon": 10, "reuse": True, "mode": mode, "rtt_ms": 0, "loss": loss, "rate": _loss_run(mode, loss, seconds)}
        for loss in losses
    ]
    return _with_idle(rows)


def _loss_run(mode: str, loss: float, seconds: float) -> float:
    with NetnsLink() as link, common.children() as started:
        if loss:
            link.loss(loss)
        trainer = common.TrainerChild(
            "--horizon", "10", "--action-dim", str(ACTION_DIM), "--reuse", "--host", NetnsLink.TRAINER_ADDR,
            prefix=["ip", "netns", "exec", link.trainer],
        )  # fmt: skip
        started.append(trainer)
        uri = f"ws://{NetnsLink.TRAINER_ADDR}:{trainer.port}"
        started.extend(common.Child(c) for c in probe_children(uri, mode, True, link.exec_prefix()))
        common.wait_for(lambda: trainer.stats()["steps"] > 2, 60.0, "the bridge's first steps")
        return measure(trainer, seconds, settle=1.0)


CAP_MBIT = 5.0
# The scenario (two raw 640x480 cameras behind 5 Mbit/s, memory bounded over 2 minutes) runs
# 2 minutes; the other cases compare bytes and rates and need less.
LONG_CAP_SECONDS = 120.0
# (label, sensor_node camera, resize, reuse): two cameras, 14 joints, timer mode at 100 Hz, H = 8
CAP_CASES = (
    ("raw 640x480, reuse on", "raw640", None, True),
    ("raw 640x480, reuse off", "raw640", None, False),
    ("JPEG 640x480 source, reuse on", "jpeg640", None, True),
    ("raw 640x480 resized to 224x224, reuse on", "raw640", [224, 224], True),
)


def run_cap_case(label: str, camera: str, resize: list[int] | None, reuse: bool, seconds: float, workdir: Path) -> dict:
    """The bridge with two cameras behind a 5 Mbit/s uplink: its step rate, bytes per step and memory over time."""
    import psutil
    from bench_observation import CAMERAS, bridge_params
    from bench_timing import nest

    with NetnsLink() as link, common.children() as started:
        link.cap(CAP_MBIT)
        trainer = common.TrainerChild(
            "--horizon", "8", "--action-dim", "14", "--reuse", "--host", NetnsLink.TRAINER_ADDR,
            prefix=["ip", "netns", "exec", link.trainer],
        )  # fmt: skip
        started.append(trainer)
        prefix = link.exec_prefix()
        sensors = common.python_script("sensor_node.py", "--envs", "1", "--camera", camera, "--camera-hz", "10")
        started.append(common.Child(prefix + sensors))
        params = bridge_params(camera, 1)
        params.update(
            {
                "trainer.uri": f"ws://{NetnsLink.TRAINER_ADDR}:{trainer.port}",
                "trainer.use_reuse": reuse,
                "status.log_period_s": 0.0,
            }
        )
        if resize:
            for cam in CAMERAS:
                params[f"observations.images.{cam}.resize"] = resize
        config = common.write_params(workdir / f"cap-{camera}-{resize}-{reuse}.yaml", nest(params))
        bridge = common.Child(
            prefix + common.python_module("plugrl_ros.node.bridge_main", "--ros-args", "--params-file", str(config))
        )
        started.append(bridge)
        common.wait_for(lambda: trainer.stats()["feedbacks"] > 1, 90.0, "the bridge's first feedbacks")
        proc = psutil.Process(bridge.pid)  # `ip netns exec` execs the bridge: the same process
        before = trainer.stats()
        rss = [proc.memory_info().rss / 2**20]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(1.0)  # a memory sample a second over the window
            rss.append(proc.memory_info().rss / 2**20)
        wire = common.difference(trainer.stats(), before)
        if not bridge.alive():
            raise RuntimeError("the bridge exited:\n" + bridge.output()[-3000:])
        # the bench trainer is strict: a broken rule (a corrupted or out-of-order message) is a resync
        broken = trainer.output().count("the client broke a protocol rule")
    steps = wire["feedback_rows"] * 8
    return {
        "case": label,
        "steps_per_s": steps / wire["t"],
        "bytes_per_step": wire["bytes_in"] / steps if steps else float("nan"),
        "link_mbit": wire["bytes_in"] * 8 / wire["t"] / 1e6,
        "rss_first_mb": rss[0],
        "rss_last_mb": rss[-1],
        "rss_max_mb": max(rss),
        "rss_mb": rss,  # one sample a second over the window
        "seconds": seconds,
        "protocol_breaks": broken,
        "connections": wire["connections"],
    }


def _with_idle(rows: list[dict]) -> list[dict]:
    base = rows[0]["rate"] if rows else float("nan")
    for r in rows:
        r["idle"] = max(0.0, 1 - r["rate"] / RATE_HZ) if r["mode"] == "timer" else max(0.0, 1 - r["rate"] / base)
    return rows


def tables(results: dict[str, Any]) -> str:
    rows = [r for r in results["rows"] if r["loss"] == 0.0 and r.get("group") == "rtt"]
    rtts = sorted({r["rtt_ms"] for r in rows})
    head = ["mode", "H", "reuse"] + [f"{t} ms: steps/s (idle)" for t in rtts]
    body = []
    for mode in ("lockstep", "timer"):
        for h in sorted({r["horizon"] for r in rows}):
            for reuse in (True, False):
                cells = {r["rtt_ms"]: r for r in rows if (r["mode"], r["horizon"], r["reuse"]) == (mode, h, reuse)}
                if not cells:
                    continue
                body.append(
                    [mode, h, "on" if reuse else "off"]
                    + [f"{cells[t]['rate']:,.1f} ({cells[t]['idle']:.0%})" if t in cells else "-" for t in rtts]
                )
    text = (
        "### Env-step rate vs round-trip time (probe robot + bridge, 1 env, through a delaying relay; "
        f"timer mode at {RATE_HZ:g} Hz)\n\n" + common.md_table(head, body) + "\n\nidle: timer = share of ticks "
        "without an action (1 - rate/50); lockstep = share of the 0 ms rate lost to waiting, same run."
    )
    loss_rows = [r for r in results["rows"] if r.get("group") == "loss"]
    if loss_rows:
        body = [[r["mode"], f"{r['loss']:.0%}", f"{r['rate']:,.1f}", f"{r['idle']:.0%}"] for r in loss_rows]
        text += (
            "\n\n### Env-step rate vs packet loss (H = 10, reuse on, no added delay; iptables in network namespaces)"
            "\n\n" + common.md_table(["mode", "loss each way", "steps/s", "idle"], body)
        )
    cap_rows = results.get("cap", [])
    if cap_rows:
        body = [
            [
                r["case"],
                f"{r['steps_per_s']:,.2f}",
                f"{r['bytes_per_step'] / 1e3:,.0f}",
                f"{r['link_mbit']:.2f}",
                f"{r['rss_first_mb']:.0f} / {r['rss_max_mb']:.0f} / {r['rss_last_mb']:.0f}",
            ]
            for r in cap_rows
        ]
        text += (
            f"\n\n### Two cameras behind a {CAP_MBIT:g} Mbit/s uplink (tc tbf; timer mode 100 Hz, H = 8)\n\n"
            + common.md_table(
                ["case", "window s", "steps/s", "kB per step", "uplink Mbit/s", "bridge RSS MB first/max/last"],
                [[row[0], f"{r['seconds']:g}", *row[1:]] for row, r in zip(body, cap_rows, strict=True)],
            )
        )
        first = cap_rows[0]
        samples = first["rss_mb"][:: max(1, len(first["rss_mb"]) // 12)]
        text += (
            f"\n\nBridge memory over time, {first['case']} ({first['seconds']:g} s, every "
            f"{max(1, len(first['rss_mb']) // 12)} s), MB: " + " ".join(f"{v:.0f}" for v in samples)
        )
    if results.get("loss_skipped"):
        text += f"\n\nPacket loss not measured: {results['loss_skipped']}"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_arguments(parser, repeat=1)
    parser.add_argument("--seconds", type=float, default=5.0, help="measurement window per point")
    parser.add_argument(
        "--cap-seconds",
        type=float,
        default=30.0,
        help=f"window of each bandwidth-cap case (the first, raw cameras with reuse, runs {LONG_CAP_SECONDS:g} s)",
    )
    parser.add_argument("--only-cap", action="store_true", help="only the bandwidth-cap cases")
    args = parser.parse_args()

    if args.quick:
        groups = [(10, True, "lockstep")]
        rtts, losses, seconds = (0, 150), (), 1.5
    else:
        groups = [(h, reuse, mode) for mode in ("lockstep", "timer") for h in HORIZONS for reuse in (True, False)]
        rtts, losses, seconds = RTTS_MS, LOSSES, args.seconds
    if args.only_cap:
        groups, losses = [], LOSSES[:1]
    rows: list[dict] = []
    for h, reuse, mode in groups:
        for r in run_rtt_group(h, reuse, mode, rtts, seconds):
            rows.append({**r, "group": "rtt"})
    results: dict[str, Any] = {"rows": rows}
    why = netns_unavailable() if losses else "not in --quick"
    if why is None:
        for mode in ("lockstep", "timer") if not args.only_cap else ():
            for r in run_loss_group(mode, losses, seconds):
                rows.append({**r, "group": "loss"})
        with tempfile.TemporaryDirectory() as workdir:
            windows = [max(args.cap_seconds, LONG_CAP_SECONDS)] + [args.cap_seconds] * (len(CAP_CASES) - 1)
            results["cap"] = [
                run_cap_case(*case, window, Path(workdir)) for case, window in zip(CAP_CASES, windows, strict=True)
            ]
    else:
        results["loss_skipped"] = why
    print(tables(results))
    common.save_json(args.json, "network", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
