"""Soak: the bridge against a trainer and a robot that keep failing, for many minutes; does anything grow?

Opt-in (never run by the test suite)::

    source scripts/env.sh && python bench/soak.py --minutes 10

What runs, all as real processes except the trainer:

* the bridge (``plugrl_ros.node.bridge_main``, config/probe.yaml with short timeouts);
* the probe robot with injected faults (this file, ``robot`` subcommand): now and then an env stops
  answering its steps for a while (a sensor silence: the bridge fails the env, truncates or reopens,
  resets it), and now and then a reset call fails (retried with backoff);
* the protocol-checking test trainer (in this process), whose script ends each connection, after
  ``--feedbacks`` feedbacks, with a random fault: resync, ``Feedback timeout``, an internal error
  (1011) or a dropped TCP connection. It checks every transition of the whole run.

Every ``--sample-s`` seconds the bridge process's RSS, thread count and open file descriptors are
sampled (psutil) with the run's progress. The bridge's asyncio task count is not sampled: it would
need a debug hook in the product. At the end a table, the fault counts, the trainer's verdict and a
resource verdict: after the warm-up, RSS may not grow by more than ``--max-rss-growth-mib`` and
threads and file descriptors by more than 2.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# A ROS domain of its own: never talk to a test run or another engineer's nodes.
DEFAULT_DOMAIN_ID = "95"
TRAINER_FAULTS = ("resync", "timeout", "crash", "drop")


# -- the faulty probe robot (a subprocess) --------------------------------------------------------


def run_robot(args: argparse.Namespace) -> int:
    """The probe robot, with sensor silences and failing resets injected at random."""
    import rclpy
    from std_msgs.msg import Bool, Float32
    from std_srvs.srv import Trigger

    from plugrl_ros.ros.spin import spin_until_shutdown
    from plugrl_ros.tools.probe_robot import ProbeRobot

    rng = random.Random(args.seed)
    counts: collections.Counter[str] = collections.Counter()

    class FaultyProbeRobot(ProbeRobot):
        def __init__(self) -> None:
            self.silent_until = [0.0] * args.envs
            super().__init__(args.envs, 2)

        def _on_action(self, env: int):
            def callback(msg) -> None:
                counts["actions"] += 1
                now = time.monotonic()
                if now >= self.silent_until[env] and rng.random() < args.silence_p:
                    self.silent_until[env] = now + rng.uniform(0.2, 1.5)
                    counts["sensor silences"] += 1
                if now < self.silent_until[env]:
                    # the robot moves but its sensors say nothing: the bridge must give the step up
                    self.envs.step(env, list(msg.data))
                    counts["steps unanswered"] += 1
                    return
                reward, terminated = self.envs.step(env, list(msg.data))
                self._publish_state(env)
                _, _, reward_pub, done_pub = self._pubs[env]
                reward_pub.publish(Float32(data=reward))
                done_pub.publish(Bool(data=terminated))

            return callback

        def _on_reset(self, env: int):
            def callback(request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
                if rng.random() < args.reset_fail_p:
                    counts["reset failures"] += 1
                    response.success = False
                    response.message = "soak: injected reset failure"
                    return response
                counts["resets"] += 1
                self.envs.reset(env)
                self._publish_state(env)
                response.success = True
                return response

            return callback

    rclpy.init()
    try:
        return spin_until_shutdown(FaultyProbeRobot())
    finally:
        print("SOAK-ROBOT " + json.dumps(dict(counts)), flush=True)


# -- the trainer (a thread of this process) ---------------------------------------------------------


class Trainer:
    """The test trainer on its own event loop thread, counting how each connection was ended."""

    def __init__(self, settings) -> None:
        from plugrl_ros.tools.test_trainer import TestTrainer

        endings: collections.Counter[str] = collections.Counter()

        class CountingTrainer(TestTrainer):
            async def _end(self, link, ending, exchange):
                endings[ending] += 1
                return await super()._end(link, ending, exchange)

        self.endings = endings
        self._trainer = CountingTrainer(settings)
        self._loop = asyncio.new_event_loop()
        self._port: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._report: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name="soak-trainer", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve():
            self._port.set_result(await self._trainer.start())
            return await self._trainer.finished()

        try:
            self._report.set_result(self._loop.run_until_complete(serve()))
        except BaseException as exc:  # hand it to the main thread
            if not self._port.done():
                self._port.set_exception(exc)
            self._report.set_exception(exc)

    def start(self) -> int:
        self._thread.start()
        return self._port.result(timeout=10)

    def snapshot(self):
        """The report so far (taken on the trainer's loop)."""

        async def take():
            return self._trainer.report

        return asyncio.run_coroutine_threadsafe(take(), self._loop).result(timeout=10)

    def report(self, timeout: float):
        return self._report.result(timeout=timeout)


# -- sampling ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t_s: float
    chunks: int
    connections: int
    rss_mib: float
    threads: int
    fds: int
    cpu_percent: float


def chunks_checked(report) -> int:
    """Env rows fed back and checked by the trainer (one per chunk that ran)."""
    from plugrl_ros.tools.test_trainer import TERMINAL_OBSERVATION

    return report.clause(TERMINAL_OBSERVATION).checks


def print_table(samples: list[Sample]) -> None:
    print("| t (s) | chunks | connections | RSS (MiB) | threads | fds | CPU % |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for s in samples:
        print(
            f"| {s.t_s:.0f} | {s.chunks} | {s.connections} | {s.rss_mib:.1f} | {s.threads} | {s.fds} "
            f"| {s.cpu_percent:.0f} |"
        )


def slope_per_hour(samples: list[Sample]) -> float:
    """Least-squares growth of RSS in MiB per hour over ``samples``."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mx = sum(s.t_s for s in samples) / n
    my = sum(s.rss_mib for s in samples) / n
    var = sum((s.t_s - mx) ** 2 for s in samples)
    if var == 0:
        return 0.0
    return sum((s.t_s - mx) * (s.rss_mib - my) for s in samples) / var * 3600.0


def report_summary(report) -> str:
    """The trainer's report without its long lists (the script, the entries not run, one note per reopen)."""
    lines, reopened, notes_at = [], 0, None
    for line in report.text().splitlines()[1:]:
        if line.startswith("script incomplete"):
            line = line[:160] + " ..." if len(line) > 160 else line
            line += " (expected: the soak stops the bridge in the middle of the script)"
        elif "the client closed connection" in line and "before the trainer ended it" in line:
            reopened += 1
            continue
        elif line == "notes:":
            notes_at = len(lines) + 1
        lines.append(line)
    if reopened and notes_at is not None:
        lines.insert(
            notes_at, f"  - the bridge closed {reopened} connection(s) itself (1000) before the trainer ended them"
        )
    return "\n".join(lines)


# -- the run ----------------------------------------------------------------------------------------


def stop_child(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    """SIGINT (never -9 for a ROS process: Fast DDS would leave /dev/shm files)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
    return proc.wait()


def bridge_command(uri: str, args: argparse.Namespace) -> list[str]:
    envs = "[" + ", ".join(f"'probe{i}'" for i in range(args.envs)) + "]"
    overrides = {
        "trainer.uri": uri,
        "trainer.reconnect_initial_s": "0.05",
        "trainer.reconnect_max_s": "0.5",
        "envs": envs,
        "control.mode": args.mode,
        "control.rate_hz": f"{args.rate!r}",
        "control.env_timeout_s": "0.5",
        "reset.timeout_s": "1.0",
        "reset.retry_initial_s": "0.1",
        "reset.retry_max_s": "0.5",
        "status.log_period_s": "0.0",
    }
    command = [sys.executable, "-m", "plugrl_ros.node.bridge_main", "--ros-args", "--params-file"]
    command.append(str(ROOT / "config" / "probe.yaml"))
    for key, value in overrides.items():
        command += ["-p", f"{key}:={value}"]
    return command


BRIDGE_EVENTS = {
    "env failures (step result overdue)": r"\]: env \d+: no step result for",
    "  of which truncated at the last reported step": r"\]: env \d+: .*truncated at its last reported step",
    "  of which reopened the connection (no step reported)": r"\]: env \d+: .*during the first step of a chunk",
    "reset failures seen": r"reset of \S+ failed",
    "connections lost or closed by the trainer": r"trainer connection closed \((?:connection lost|resync)",
    "tracebacks": r"Traceback",
}


def run(args: argparse.Namespace) -> int:
    import psutil

    from plugrl_ros.tools.test_trainer import TrainerSettings

    rng = random.Random(args.seed)
    script = (*(rng.choice(TRAINER_FAULTS) for _ in range(100_000)), "serve")
    settings = TrainerSettings(
        port=0,
        script=script,
        feedbacks_per_connection=args.feedbacks,
        horizon=args.horizon,
        n_envs=args.envs,
        metadata_delay_s=0.05,
        grace_s=2.0,
        reconnect_window_s=15.0,
    )
    env = dict(os.environ)
    env["ROS_DOMAIN_ID"] = args.domain
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    logs = Path(tempfile.mkdtemp(prefix="plugrl-soak-"))
    trainer = Trainer(settings)
    port = trainer.start()
    robot_log, bridge_log = (logs / "robot.log").open("w+"), (logs / "bridge.log").open("w+")
    robot_cmd = [sys.executable, str(Path(__file__).resolve()), "robot", "--envs", str(args.envs)]
    robot_cmd += [
        "--seed",
        str(args.seed),
        "--silence-p",
        str(args.silence_p),
        "--reset-fail-p",
        str(args.reset_fail_p),
    ]
    robot = subprocess.Popen(robot_cmd, env=env, stdout=robot_log, stderr=subprocess.STDOUT, text=True)
    bridge = subprocess.Popen(
        bridge_command(f"ws://127.0.0.1:{port}", args), env=env, stdout=bridge_log, stderr=subprocess.STDOUT
    )
    print(f"soak: {args.minutes:g} min, {args.envs} probe envs ({args.mode}), logs in {logs}", flush=True)
    process = psutil.Process(bridge.pid)
    process.cpu_percent(None)
    samples: list[Sample] = []
    t0 = time.monotonic()
    deadline = t0 + args.minutes * 60.0
    next_sample = t0
    code = None
    try:
        while time.monotonic() < deadline:
            code = bridge.poll()
            if code is not None:
                print(f"soak: the bridge exited early with status {code}", flush=True)
                break
            now = time.monotonic()
            if now >= next_sample:
                report = trainer.snapshot()
                with process.oneshot():
                    sample = Sample(
                        now - t0,
                        chunks_checked(report),
                        report.connections,
                        process.memory_info().rss / 2**20,
                        process.num_threads(),
                        process.num_fds(),
                        process.cpu_percent(None),
                    )
                samples.append(sample)
                print(
                    f"  t={sample.t_s:6.0f} s  chunks {sample.chunks:7d}  connections {sample.connections:5d}  "
                    f"RSS {sample.rss_mib:6.1f} MiB  threads {sample.threads:3d}  fds {sample.fds:4d}  "
                    f"CPU {sample.cpu_percent:3.0f} %  failed clauses {report.failed}",
                    flush=True,
                )
                if args.chunks and sample.chunks >= args.chunks:
                    break
                next_sample += args.sample_s
            time.sleep(min(0.5, max(0.0, next_sample - time.monotonic())))  # pacing the sampler, not syncing
    finally:
        bridge_code = stop_child(bridge) if code is None else code
        stop_child(robot)
    report = trainer.report(timeout=settings.reconnect_window_s + settings.grace_s + 30)
    elapsed = time.monotonic() - t0
    bridge_log.seek(0)
    bridge_text = bridge_log.read()
    robot_log.seek(0)
    robot_text = robot_log.read()

    print("\n## Samples (bridge process)\n")
    print_table(samples)
    print("\n## Faults\n")
    print(f"run: {elapsed / 60:.1f} min, {chunks_checked(report)} chunks checked, {report.connections} connections")
    for ending in TRAINER_FAULTS:
        print(f"trainer ended a connection with {ending!r}: {trainer.endings[ending]}")
    robot_counts = next(
        (json.loads(line[len("SOAK-ROBOT ") :]) for line in robot_text.splitlines() if line.startswith("SOAK-ROBOT ")),
        {},
    )
    for key, value in sorted(robot_counts.items()):
        print(f"robot {key}: {value}")
    for name, pattern in BRIDGE_EVENTS.items():
        print(f"bridge {name}: {len(re.findall(pattern, bridge_text))}")
    print(f"bridge exit status: {bridge_code}")
    print("\n## Trainer report\n")
    print(report_summary(report))

    print("\n## Verdict\n")
    warm = [s for s in samples if s.t_s >= args.warmup_s]
    verdicts = []
    if len(warm) >= 2:
        first, last = warm[0], warm[-1]
        peak = max(s.rss_mib for s in warm)
        rss_ok = last.rss_mib - first.rss_mib <= args.max_rss_growth_mib and peak - first.rss_mib <= (
            args.max_rss_growth_mib * 1.5
        )
        threads_ok = max(s.threads for s in warm) - first.threads <= 2
        fds_ok = max(s.fds for s in warm) - first.fds <= 2
        print(
            f"after the {args.warmup_s:g} s warm-up: RSS {first.rss_mib:.1f} -> {last.rss_mib:.1f} MiB "
            f"(peak {peak:.1f}, trend {slope_per_hour(warm):+.1f} MiB/h), threads {first.threads} -> "
            f"{last.threads} (max {max(s.threads for s in warm)}), fds {first.fds} -> {last.fds} "
            f"(max {max(s.fds for s in warm)})"
        )
        verdicts += [("memory", rss_ok), ("threads", threads_ok), ("file descriptors", fds_ok)]
    else:
        print("not enough samples after the warm-up for a resource verdict")
        verdicts.append(("samples", False))
    verdicts.append(("bridge exit status 0", bridge_code == 0))
    verdicts.append(("no Traceback in the bridge log", "Traceback" not in bridge_text))
    verdicts.append(("trainer: no failed clause", report.failed == 0))
    for name, ok in verdicts:
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print(f"logs: {logs}")
    return 0 if all(ok for _, ok in verdicts) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soak", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    robot = sub.add_parser("robot", help="(internal) the faulty probe robot")
    robot.add_argument("--envs", type=int, default=3)
    robot.add_argument("--seed", type=int, default=1)
    robot.add_argument("--silence-p", type=float, default=0.002)
    robot.add_argument("--reset-fail-p", type=float, default=0.1)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to run (default %(default)s)")
    parser.add_argument("--chunks", type=int, default=0, help="stop after this many checked chunks (0: no limit)")
    parser.add_argument("--envs", type=int, default=3, help="probe envs (default %(default)s)")
    parser.add_argument("--mode", choices=("lockstep", "timer"), default="lockstep")
    parser.add_argument("--rate", type=float, default=50.0, help="timer mode rate, Hz")
    parser.add_argument("--horizon", type=int, default=4, help="action chunk length (default %(default)s)")
    parser.add_argument("--feedbacks", type=int, default=40, help="feedbacks per connection before its fault")
    parser.add_argument("--silence-p", type=float, default=0.002, help="per step: an env's sensors go silent")
    parser.add_argument("--reset-fail-p", type=float, default=0.1, help="per reset call: it fails")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sample-s", type=float, default=15.0, help="sampling period (default %(default)s)")
    parser.add_argument("--warmup-s", type=float, default=60.0, help="ignored for the verdict (default %(default)s)")
    parser.add_argument("--max-rss-growth-mib", type=float, default=8.0)
    parser.add_argument("--domain", default=DEFAULT_DOMAIN_ID, help="ROS_DOMAIN_ID (default %(default)s)")
    args = parser.parse_args(argv)
    if args.command == "robot":
        return run_robot(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
