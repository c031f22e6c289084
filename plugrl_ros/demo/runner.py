"""``plugrl-demo``: the whole demo in one command: trainer, simulated robot and bridge, live progress, a plot.

The trainer runs in this process (on its own thread); the robot node and the
bridge run as separate ROS processes, the bridge configured by the shipped
``config/demo.yaml`` plus command-line overrides, exactly as a user would
start it. Their logs go to files under the output directory; the terminal
shows one progress line, fed by the trainer's statistics and the bridge's
``/diagnostics``. The trainer ends the run after ``--duration`` seconds, the
bridge then exits by itself. Then the demo deploys what was learned:
``plugrl-test-policy-server --linear`` serves the demo trainer's ``policy.npz``
(``plugrl-policy-server --rllib`` the RLlib trainer's checkpoint) and the same
bridge config, in ``mode: deploy``, drives the same robots for
``--deploy-duration`` seconds; the bridge's /diagnostics count the deployed
policy's episodes and returns. The demo writes ``summary.json``,
``episodes.csv`` and, when matplotlib is installed, the plot ``returns.png``,
with the deployed policy's mean return beside the training curve.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from plugrl_ros import stop_request
from plugrl_ros.demo.children import (
    Child,
    bridge_command,
    deploy_bridge_command,
    robot_command,
    teleop_command,
)
from plugrl_ros.demo.diagnostics import BridgeStatus, DeployStatus, DiagnosticsWatch, intervention_summary
from plugrl_ros.demo.learned_policy import LearnedPolicy, learned_policy
from plugrl_ros.demo.progress import Progress, deploy_status_line, status_line
from plugrl_ros.demo.results import NO_PLOT, EpisodeRecord, summarize, write_results
from plugrl_ros.demo.rllib_trainer import ALGORITHMS, rllib_trainer
from plugrl_ros.demo.sb3_trainer import sb3_trainer
from plugrl_ros.demo.trainer import RECENT_EPISODES, DemoTrainer, DemoTrainerSettings, TrainerStats
from plugrl_ros.shipped import shipped_file
from plugrl_ros.tools.policy_server import BACKENDS, missing
from plugrl_ros.tools.serving import TrainerThread

EXIT_OK = 0
EXIT_FAILED = 1

CONNECT_TIMEOUT_S = 60.0  # the bridge must reach the trainer within this long of starting
TRAINER_START_TIMEOUT_S = 120.0  # RLlib starts Ray and builds its algorithm before it listens
END_GRACE_S = 60.0  # after the run ends, the bridge must exit within this long
# The demo's feedback arrives within milliseconds, and config/demo.yaml makes the bridge send it within
# control.feedback_deadline_s (5 s) in any case; a link that stalls is closed after this (a PlugRL
# trainer waits 60 s) and the bridge reconnects.
FEEDBACK_TIMEOUT_S = 10.0


# -- the run ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="plugrl-demo", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=180.0, help="seconds of training (default %(default)s)")
    p.add_argument("--envs", type=int, default=2, help="simulated robots (default %(default)s)")
    p.add_argument(
        "--mode",
        choices=("lockstep", "timer"),
        help="lockstep: the simulator steps per command, as fast as it can (the default); "
        "timer: a fixed-rate loop, like a real robot (the default with --teleop scripted)",
    )
    p.add_argument("--rate", type=float, default=20.0, help="timer mode: control rate in Hz (default %(default)s)")
    p.add_argument(
        "--deploy-duration",
        type=float,
        default=20.0,
        help="then run the learned policy in deploy mode, served by a policy server, for this many seconds "
        "(default %(default)s; 0: no deploy step)",
    )
    p.add_argument("--output", default="demo-output", help="results and logs go here (default %(default)s/)")
    p.add_argument("--seed", type=int, default=0, help="seeds the robot's poses and the trainer (default %(default)s)")
    p.add_argument(
        "--trainer",
        choices=("demo", "rllib", "sb3"),
        default="demo",
        help="demo: the small local trainer (default); rllib: RLlib's PPO through a PlugRL EnvRunner "
        "(needs the rllib extra: scripts/setup-venv.sh .venv kilted '' rllib); its checkpoint is then deployed "
        "with plugrl-policy-server --rllib; sb3: Stable-Baselines3's PPO through the Gymnasium vector env (needs "
        "the sb3 extra); its model is then deployed with plugrl-policy-server --sb3",
    )
    p.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default="PPO",
        help="with --trainer rllib or sb3: PPO (default; the robots wait while it learns) or SAC (off-policy)",
    )
    p.add_argument(
        "--teleop",
        choices=("none", "scripted"),
        default="none",
        help="scripted: a person in the loop, stood in for by plugrl-demo-teleop (a gamepad on each reacher that "
        "takes over when the arm strays, for the first --teleop-minutes); the bridge gets "
        "config/demo_intervention.yaml, and the summary the person's share of the steps",
    )
    p.add_argument(
        "--teleop-minutes",
        type=float,
        default=3.0,
        help="with --teleop scripted: the person helps during the run's first this many minutes (0: always)",
    )
    p.add_argument(
        "--demonstrations",
        type=Path,
        help="with --algorithm SAC: a folder plugrl-export --to rllib wrote (demonstrations of the demo reachers, "
        "exported with --images ''); a quarter of every batch SAC learns from is drawn from it",
    )
    p.add_argument(
        "--record",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the bridge records every transition as MCAP into the output folder, beside the plot "
        "(default: on; read it with plugrl-record-info or Foxglove)",
    )
    return p


def _check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if not args.duration > 0:
        parser.error("--duration must be a positive number of seconds")
    if not args.deploy_duration >= 0:
        parser.error("--deploy-duration must be 0 (no deploy step) or a positive number of seconds")
    if args.envs < 1:
        parser.error("--envs must be at least 1")
    if not 0 < args.rate <= 1000:
        parser.error("--rate must be in (0, 1000] Hz")
    if args.algorithm != "PPO" and args.trainer == "demo":
        parser.error(
            f"--algorithm {args.algorithm} needs --trainer rllib or sb3 (the demo trainer is its own algorithm)"
        )
    if args.demonstrations is not None and args.trainer != "rllib":
        parser.error("--demonstrations needs --trainer rllib --algorithm SAC (RLlib's offline episodes)")
    if args.demonstrations is not None and args.algorithm != "SAC":
        parser.error("--demonstrations needs --trainer rllib --algorithm SAC (an off-policy learner's replay buffer)")
    if args.demonstrations is not None and not any(args.demonstrations.glob("*.parquet")):
        parser.error(f"--demonstrations: {args.demonstrations} holds no .parquet files (plugrl-export --to rllib)")
    if args.teleop == "scripted" and args.mode == "lockstep":
        parser.error("--teleop scripted needs --mode timer: a person acts in real time, not per simulator step")
    if not args.teleop_minutes >= 0:
        parser.error("--teleop-minutes must be 0 (always) or a positive number of minutes")
    if args.mode is None:
        args.mode = "timer" if args.teleop == "scripted" else "lockstep"
    if args.trainer in BACKENDS:
        needed, install, _ = BACKENDS[args.trainer]
        problem = missing(needed)
        if problem is not None:
            parser.error(f"--trainer {args.trainer} needs {needed} ({problem}); {install}")


class DemoRun:
    """Starts the three parts, watches them, stops them, and reports."""

    def __init__(self, args: argparse.Namespace, out: IO[str]) -> None:
        self.args = args
        self.out = out
        self.output = Path(args.output)
        self.logs = self.output / "logs"
        self.failure: str | None = None

    def _say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def run(self) -> int:
        args = self.args
        self.logs.mkdir(parents=True, exist_ok=True)
        config = shipped_file("config", "demo.yaml")
        _log_to_file(self.logs / "trainer.log")
        settings = DemoTrainerSettings(
            port=0, duration_s=args.duration, seed=args.seed, feedback_timeout_s=FEEDBACK_TIMEOUT_S
        )
        # RLlib starts Ray and builds its algorithm before it listens. Ray's start can freeze the whole
        # interpreter (its core worker waits for worker processes that died, holding the interpreter lock),
        # which no timeout in Python sees: a watchdog outside the interpreter ends the process, with its stacks.
        faulthandler.dump_traceback_later(TRAINER_START_TIMEOUT_S + 30.0, exit=True)
        try:
            trainer = make_trainer(args, settings, config)
            port = trainer.start(timeout=TRAINER_START_TIMEOUT_S)
        finally:
            faulthandler.cancel_dump_traceback_later()
        started_wall = time.time()
        mode = args.mode + (f" at {args.rate:g} Hz" if args.mode == "timer" else "")
        self._say(
            f"plugrl-demo: {args.envs} simulated reacher(s), {mode}, learning for {args.duration:g} s; "
            f"trainer on port {port}; bridge config {config}; logs in {self.logs}/"
        )
        self._say(
            "progress: time | trainer link | env steps/s | episodes | mean return of the last "
            f"{RECENT_EPISODES} episodes | infer round trip (bridge median)"
        )
        watch = DiagnosticsWatch()
        robot = Child("robot", robot_command(args), self.logs / "robot.log")
        deploy: dict[str, Any] | None = None
        person: Child | None = None
        try:
            if args.teleop == "scripted":
                person = Child("scripted person", teleop_command(args), self.logs / "teleop.log")
            bridge = Child("bridge", bridge_command(args, config, port), self.logs / "bridge.log")
            progress = Progress(self.out)
            started = time.monotonic()
            latencies: list[float] = []
            try:
                self._watch(trainer, watch, robot, bridge, progress, started, latencies)
            finally:
                progress.done()
                trainer.end()
                bridge_code = bridge.stop()
                if person is not None:
                    person.stop()
                trainer.join(10.0)
            history = watch.history()
            # the trainer has stopped: nothing changes what it learned any more
            policy = learned_policy(trainer.trainer, self.output, config, settings.horizon)
            if (
                policy is not None
                and args.deploy_duration > 0
                and self.failure is None
                and bridge_code == 0
                and trainer.error is None
                and not stop_request.requested()
            ):
                deploy = self._deploy(config, policy, watch, robot)
        finally:
            robot_code = robot.stop()
            watch.close()
        # Ctrl-C or SIGTERM: the run ends early, but in order, and its results are written as at its end.
        interrupted = stop_request.requested()
        if interrupted:
            self._say("plugrl-demo: interrupted; stopped the bridge, the robot and the trainer")
        stats = trainer.trainer.stats()
        records = trainer.trainer.records()
        summary = summarize(records, stats.elapsed_s)
        summary.update(self._run_facts(history, stats, latencies, bridge_code, robot_code))
        if deploy is not None:
            summary["deploy"] = deploy
        if self.failure is None and trainer.error is not None:
            self.failure = f"the trainer failed: {trainer.error!r}"
        if self.failure is None and bridge_code != 0:
            self.failure = f"the bridge exited with status {bridge_code}; see {bridge.log_path}"
        if self.failure is None and robot_code != 0:
            self.failure = f"the robot exited with status {robot_code}; see {robot.log_path}"
        if self.failure is None and not records and not interrupted:
            self.failure = "no episode completed"
        summary["ok"] = self.failure is None
        summary["interrupted"] = interrupted
        if self.failure is not None:
            summary["failure"] = self.failure
        paths = write_results(self.output, records, summary)
        if policy is not None:
            paths[policy.name] = policy.path
        recordings = recordings_made(self.output, started_wall) if args.record else []
        if recordings:
            paths["recording"] = " ".join(str(path) for path in recordings)
        self._print_summary(summary, paths)
        return EXIT_OK if self.failure is None else EXIT_FAILED

    # -- the deploy step ------------------------------------------------------------

    def _deploy(self, config: Path, policy: LearnedPolicy, watch: DiagnosticsWatch, robot: Child) -> dict[str, Any]:
        """Serve ``policy`` and drive the same robots with it in deploy mode; what /diagnostics counted.

        On a failure :attr:`failure` says what (the training results stand).
        """
        args = self.args
        horizon = policy.horizon
        self._say(
            f"plugrl-demo: deploying the learned policy ({policy.path}) for {args.deploy_duration:g} s: "
            f"{policy.server} serves it, the bridge runs in mode deploy at {args.rate:g} Hz"
        )
        server = Child("policy server", policy.command, self.logs / "policy_server.log")
        progress = Progress(self.out)
        status: DeployStatus | None = None
        bridge_code = server_code = None
        try:
            port = self._server_port(server)
            if port is not None:
                command = deploy_bridge_command(args, config, port, horizon, policy.execution)
                bridge = Child("deploy bridge", command, self.logs / "deploy_bridge.log")
                try:
                    status = self._watch_deploy(bridge, server, robot, watch, progress)
                finally:
                    progress.done()
                    bridge_code = bridge.stop()
        finally:
            server_code = server.stop()
        if self.failure is None and bridge_code not in (0, None):
            self.failure = (
                f"the deploy-mode bridge exited with status {bridge_code}; see {self.logs / 'deploy_bridge.log'}"
            )
        if self.failure is None and server_code != 0:
            self.failure = f"the policy server exited with status {server_code}; see {server.log_path}"
        if self.failure is None and not stop_request.requested() and (status is None or not status.episodes):
            self.failure = f"no episode completed in deploy mode; see {self.logs / 'deploy_bridge.log'}"
        result: dict[str, Any] = {
            "duration_s": args.deploy_duration,
            "execution": policy.execution,
            "policy_server": policy.server,
            "episodes": status.episodes if status else 0,
            "mean_return": None if status is None or status.mean_return is None else round(status.mean_return, 3),
            "successes": status.successes if status else 0,
            "policy_steps": status.steps if status else 0,
            "idle_steps_at_boundaries": status.idle_steps if status else 0,
            "request_latency_median_ms": status.latency_ms if status else None,
            "bridge_exit_code": bridge_code,
            "policy_server_exit_code": server_code,
        }
        return result

    def _server_port(self, server: Child) -> int | None:
        """The port the policy server said it listens on (its first line), or None (:attr:`failure` says why)."""
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while not stop_request.requested():
            text = server.log_path.read_text()
            if "listening on" in text:
                return int(text.split("listening on", 1)[1].split()[0].rsplit(":", 1)[1])
            if server.poll() is not None or time.monotonic() > deadline:
                self.failure = f"the policy server did not start; see {server.log_path}"
                return None
            time.sleep(0.1)
        return None

    def _watch_deploy(
        self, bridge: Child, server: Child, robot: Child, watch: DiagnosticsWatch, progress: Progress
    ) -> DeployStatus | None:
        """Progress until ``--deploy-duration`` after every robot connected; the bridge's last status."""
        duration = self.args.deploy_duration
        started = time.monotonic()
        connected_at = None
        while not stop_request.requested():
            now = time.monotonic()
            for child in (bridge, server, robot):
                if child.poll() is not None:
                    self.failure = f"the {child.name} exited with status {child.poll()}; see {child.log_path}"
                    return watch.deploy
            status = watch.deploy
            if connected_at is None and status is not None and status.robots and status.connected == status.robots:
                connected_at = now
            if connected_at is None and now - started > CONNECT_TIMEOUT_S:
                self.failure = (
                    f"the bridge did not reach the policy server within {CONNECT_TIMEOUT_S:g} s; see {bridge.log_path}"
                )
                return status
            if connected_at is not None and now - connected_at >= duration:
                return status
            if progress.due(now):
                progress.show(
                    now, deploy_status_line(status, 0.0 if connected_at is None else now - connected_at, duration)
                )
            time.sleep(0.1)
        return watch.deploy

    def _watch(
        self,
        trainer: TrainerThread[list[EpisodeRecord]],
        watch: DiagnosticsWatch,
        robot: Child,
        bridge: Child,
        progress: Progress,
        started: float,
        latencies: list[float],
    ) -> None:
        """Show progress until the bridge exits, or something fails (then :attr:`failure` says what)."""
        duration = self.args.duration
        last_sample = None
        while not stop_request.requested():
            now = time.monotonic()
            if bridge.poll() is not None:
                return
            if robot.poll() is not None:
                self.failure = f"the robot exited with status {robot.poll()}; see {robot.log_path}"
                return
            stats = trainer.trainer.stats()
            if not trainer.alive and not stats.finished:
                self.failure = f"the trainer stopped unexpectedly: {trainer.error!r}"
                return
            if stats.elapsed_s == 0 and now - started > CONNECT_TIMEOUT_S:
                self.failure = f"the bridge did not connect within {CONNECT_TIMEOUT_S:g} s; see {bridge.log_path}"
                return
            if stats.finished and now - started > duration + CONNECT_TIMEOUT_S + END_GRACE_S:
                self.failure = f"the bridge did not exit after the run ended; see {bridge.log_path}"
                return
            bridge_status = watch.latest
            if bridge_status is not None and bridge_status is not last_sample:
                last_sample = bridge_status
                if bridge_status.infer_ms is not None and bridge_status.connected:
                    latencies.append(bridge_status.infer_ms)
            if progress.due(now):
                progress.show(now, status_line(stats, bridge_status, watch.steps_per_s(), duration))
            time.sleep(0.1)

    def _run_facts(
        self,
        history: list[BridgeStatus],
        stats: TrainerStats,
        latencies: list[float],
        bridge_code: int,
        robot_code: int,
    ) -> dict[str, Any]:
        args = self.args
        steps = history[-1].steps if history else 0
        facts: dict[str, Any] = {
            "envs": args.envs,
            "mode": args.mode,
            "rate_hz": args.rate if args.mode == "timer" else None,
            "seed": args.seed,
            "env_steps": steps,
            "env_steps_per_s": round(steps / stats.elapsed_s, 1) if stats.elapsed_s > 0 else None,
            "chunks": stats.chunks,
            "policy_updates": stats.updates,
            "final_policy_noise": None if stats.policy_std is None else round(stats.policy_std, 3),
            "infer_round_trip_median_ms": round(statistics.median(latencies), 2) if latencies else None,
            "trainer_reconnects": history[-1].reconnects if history else None,
            "bridge_exit_code": bridge_code,
            "robot_exit_code": robot_code,
        }
        if args.teleop == "scripted":
            facts["intervention"] = intervention_summary(history, args.teleop_minutes)
        return facts

    def _print_summary(self, summary: Mapping[str, Any], paths: Mapping[str, str]) -> None:
        lines = ["", "plugrl-demo summary"]
        lines.append(
            f"  {summary['episodes']} episodes in {summary['duration_s']:g} s, "
            f"{summary['env_steps']} env steps ({summary['env_steps_per_s'] or '-'} steps/s, {summary['envs']} envs, "
            f"{summary['mode']})"
        )
        if "first_mean_return" in summary:
            n = summary["compared_episodes"]
            lines.append(
                f"  mean episode return: first {n} episodes {summary['first_mean_return']:.2f} -> "
                f"last {n} episodes {summary['last_mean_return']:.2f} ({summary['improvement']:+.2f})"
            )
        person = summary.get("intervention")
        if person is not None:
            shares = ", ".join("-" if share is None else f"{share:.0%}" for share in person["share_by_minute"])
            total = "-" if person["share"] is None else f"{person['share']:.1%}"
            lines.append(
                f"  a person (scripted) commanded {person['person_steps']} of the steps ({total}); by minute: {shares}"
            )
        deploy = summary.get("deploy")
        if deploy is not None:
            mean = deploy["mean_return"]
            lines.append(
                f"  deployed (policy server, mode deploy, {deploy['duration_s']:g} s): {deploy['episodes']} episodes, "
                f"mean return {'-' if mean is None else f'{mean:.2f}'}, {deploy['successes']} reached the target, "
                f"{deploy['idle_steps_at_boundaries']} idle steps at chunk boundaries"
            )
        latency = summary["infer_round_trip_median_ms"]
        lines.append(f"  infer round trip (bridge, median): {'-' if latency is None else f'{latency:.1f} ms'}")
        if summary["trainer_reconnects"]:
            lines.append(
                f"  the bridge lost the trainer link {summary['trainer_reconnects']} time(s) and reconnected; "
                f"see {self.logs / 'bridge.log'}"
            )
        lines.append(f"  plot: {paths.get('returns.png', NO_PLOT)}")
        lines.append(f"  summary: {paths['summary.json']}; episodes: {paths['episodes.csv']}; logs: {self.logs}/")
        if "policy.npz" in paths:
            lines.append(f"  learned policy (W, b of its mean action): {paths['policy.npz']}")
        if "checkpoint" in paths:
            lines.append(f"  RLlib checkpoint (plugrl-policy-server --rllib serves it): {paths['checkpoint']}")
        if "model" in paths:
            lines.append(f"  Stable-Baselines3 model (plugrl-policy-server --sb3 serves it): {paths['model']}")
        if "recording" in paths:
            lines.append(f"  recording: {paths['recording']} (summary: plugrl-record-info {paths['recording']})")
        if summary.get("failure"):
            lines.append(f"  FAILED: {summary['failure']}")
        self._say("\n".join(lines))


def make_trainer(args: argparse.Namespace, settings: DemoTrainerSettings, config: Path) -> TrainerThread[Any]:
    """The demo's trainer on its thread: the demo trainer, RLlib or Stable-Baselines3 (PPO or SAC)."""
    if args.trainer == "rllib":
        checkpoint = Path(args.output) / "rllib_checkpoint"  # what the deploy step serves
        return rllib_trainer(args.algorithm, config, args.duration, args.seed, checkpoint, args.demonstrations)
    if args.trainer == "sb3":
        model = Path(args.output) / "sb3_model.zip"  # what the deploy step serves
        return sb3_trainer(args.algorithm, config, args.envs, args.duration, args.seed, model)
    return TrainerThread(DemoTrainer(settings), name="plugrl-demo-trainer")


def recordings_made(folder: Path, since: float) -> list[Path]:
    """The MCAP files the bridge wrote in ``folder`` during this run (earlier runs' files stay beside them)."""
    return sorted(path for path in folder.glob("*.mcap") if path.stat().st_mtime >= since - 1.0)


def _log_to_file(path: Path) -> None:
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("plugrl_ros")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False  # the terminal shows the progress line, not a log


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; 0 when it ran to the end and episodes completed."""
    parser = _parser()
    args = parser.parse_args(argv)
    _check(args, parser)
    # The children run in their own sessions, so they hear a stop only from
    # here: Ctrl-C or SIGTERM ends the watch below, and the run stops them in order.
    stop_request.install()
    return DemoRun(args, sys.stdout).run()


if __name__ == "__main__":
    sys.exit(main())
