"""Fault injection with real processes: the bridge keeps going, never corrupts training data, never drives garbage.

Each test breaks one thing a deployment meets - the trainer process dies, the
network stalls, the trainer closes in each of its ways, the trainer is not up
yet, a sensor or the reward goes silent, the done flag flaps, a reset fails or
hangs, the robot process dies, the operator presses Ctrl-C at any moment -
and checks both sides of the bridge: what the trainer received (where the
probe robot fits, the protocol-checking test trainer checks every transition
and its report must have no failed clause) and what the actuators received.

The bridge, the probe robot and the killed trainer run as real processes; the
fake robot of harness.Robot and the test trainers run in this process.
Waits poll conditions with a deadline; a fixed duration only ever sets how
long a fault lasts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import itertools
import math
import os
import random
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from harness import (
    OK,
    ROOT,
    STOP_BOUND_S,
    WARN,
    Child,
    Inbox,
    Robot,
    TrainerThread,
    bridge,
    bridge_params,
    env_rows,
    env_status,
    first_diag,
    float_state,
    free_port,
    merged,
    of_kind,
    per_env_chunk,
    process,
    python_module,
    reset_retry_delays,
    state_of,
    wait_until,
    with_env,
    write_params,
)
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.context import Context
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.signals import SignalHandlerOptions
from std_msgs.msg import Bool, Float32, Float64, Float64MultiArray
from std_srvs.srv import Trigger
from trainer_fixture import ScriptedTrainer

from plugrl_ros.tools.test_trainer import RECONNECTS, STOP_EXITS, TEXT_FATAL, Report, TrainerSettings

pytestmark = [pytest.mark.ros, pytest.mark.websockets, pytest.mark.slow, pytest.mark.timeout(120)]

BRIDGE = python_module("plugrl_ros.node.bridge_main")
PROBE_YAML = ROOT / "config" / "probe.yaml"
# Short timeouts so that every fault is noticed and recovered from in about a second.
FAST_PROBE: dict[str, object] = {
    "trainer.reconnect_initial_s": 0.05,
    "trainer.reconnect_max_s": 0.5,
    "control.env_timeout_s": 1.0,
    "reset.timeout_s": 1.0,
    "reset.retry_initial_s": 0.1,
    "reset.retry_max_s": 0.5,
    "status.diagnostics_period_s": 0.2,
    "status.log_period_s": 0.0,
}


# -- isolation ---------------------------------------------------------------------------


# conftest gives the workers of every run domains 20..90, and the benchmarks use 93 and 95; these
# domains' DDS ports also stay out of Linux's ephemeral port range (32768-60999).
_DOMAINS = (*range(215, 233), *range(1, 20))


def _claim_domain() -> tuple[int, IO[str]]:
    """A ROS domain no other process running these tests is using, held by a lock file until released.

    Other suites may run on this machine at the same time, this file among them;
    two bridges with the same topic names on one domain would command each
    other's robots and sum each other's rewards.
    """
    for domain in _DOMAINS:
        lock = open(Path(tempfile.gettempdir()) / f"plugrl-ros-test-domain-{domain}.lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        return domain, lock
    raise RuntimeError(f"every ROS domain of {_DOMAINS} is in use by other test processes")


@pytest.fixture(scope="module", autouse=True)
def own_ros_domain() -> Iterator[None]:
    saved = os.environ["ROS_DOMAIN_ID"]
    domain, lock = _claim_domain()
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    try:
        yield
    finally:
        os.environ["ROS_DOMAIN_ID"] = saved
        lock.close()  # releases the lock


@pytest.fixture
def robot() -> Iterator[Robot]:
    """The fake robot of test_bridge_node (also a plain listener on the probe robot's topics)."""
    fake = Robot()
    try:
        yield fake
    finally:
        fake.close()


# -- the probe deployment, piece by piece ------------------------------------------------


def _param(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def probe_bridge_command(uri: str, n_envs: int, mode: str = "lockstep", rate: float = 50.0) -> list[str]:
    """The bridge as plugrl-probe starts it (config/probe.yaml and -p overrides), with short timeouts."""
    envs = "[" + ", ".join(f"'probe{i}'" for i in range(n_envs)) + "]"
    overrides = {"trainer.uri": uri, "envs": envs, "control.mode": mode, "control.rate_hz": rate, **FAST_PROBE}
    command = [*BRIDGE, "--ros-args", "--params-file", str(PROBE_YAML)]
    for key, value in overrides.items():
        command += ["-p", f"{key}:={_param(value)}"]
    return command


@contextmanager
def shown(child: Child, name: str) -> Iterator[Child]:
    """Stop ``child`` with SIGINT when the block ends and print its output (pytest shows it on failure).

    A block that fails also prints where the child was at that moment: its stacks, or its exit code.
    """
    try:
        yield child
    except BaseException:
        print(f"--- {name} when the test failed ---\n{child.stacks()}")
        raise
    finally:
        child.stop()
        print(f"--- {name} output ---\n{child.output()}")


def probe_robot(n_envs: int) -> Any:
    """``plugrl-probe-robot --envs n_envs`` as a process (a context manager)."""
    return shown(Child(python_module("plugrl_ros.tools.probe_robot", "--envs", str(n_envs))), "probe robot")


def probe_bridge(uri: str, n_envs: int, mode: str = "lockstep", rate: float = 50.0) -> Any:
    """The bridge for the probe robot as a process (a context manager)."""
    return shown(Child(probe_bridge_command(uri, n_envs, mode, rate)), "bridge")


def step_of(msg: Float64MultiArray) -> int:
    """The chunk step k a probe command belongs to: the test trainer sends 10000*k + 10*env + dim."""
    return int(msg.data[0] // 10000)


def trainer_settings(**overrides: object) -> TrainerSettings:
    values: dict = {
        "port": 0,
        "script": ("stop",),
        "feedbacks_per_connection": 10,
        "metadata_delay_s": 0.05,
        "grace_s": 1.0,
        "reconnect_window_s": 10.0,
    }
    values.update(overrides)
    return TrainerSettings(**values)


def wait_for_actuators(listener: Robot, n_envs: int) -> None:
    """Wait until ``listener``'s subscriptions to the probe actions are matched with the bridge's publishers.

    Only then does it hear every command; discovery can take seconds on a loaded
    machine, and a short run started before would be over before it heard any.
    """
    topics = {f"/probe{i}/action" for i in range(n_envs)}

    def matched() -> bool:
        subscriptions = [s for s in listener.node.subscriptions if s.topic_name in topics]
        return len(subscriptions) == len(topics) and all(s.get_publisher_count() for s in subscriptions)

    wait_until(matched, 30, "the listener matched with the bridge's actuator publishers")


def assert_clean(report: Report, output: str = "") -> None:
    """The test trainer checked every message and found nothing wrong, and its script ran to its end."""
    assert report.failed == 0, report.text() + "\n" + output
    assert not report.incomplete, report.text() + "\n" + output


# -- 1. the trainer process dies ---------------------------------------------------------


def test_a_trainer_killed_mid_chunk_and_restarted_gets_only_clean_transitions_and_no_lost_chunk_runs_on(robot):
    n_envs, horizon = 3, 6  # probe2's episodes last 7 steps: its chunks run all 6 steps
    port = free_port()
    uri = f"ws://127.0.0.1:{port}"
    actions = [robot.listen(Float64MultiArray, f"/probe{i}/action") for i in range(n_envs)]
    doomed = Child(
        python_module(
            "plugrl_ros.tools.test_trainer",
            *("--port", str(port), "--script", "serve", "--horizon", str(horizon), "--n-envs", str(n_envs)),
            *("--metadata-delay", "0.05"),
        )
    )
    with shown(doomed, "killed trainer"):
        wait_until(lambda: "listening on" in doomed.output(), 20, "the first trainer listening")
        # timer mode at 20 Hz: a chunk takes 0.3 s, so "mid-chunk" is a moment the test can pick
        with probe_robot(n_envs), probe_bridge(uri, n_envs, mode="timer", rate=20.0) as bridge_child:

            def mid_chunk() -> bool:
                if not all(inbox.msgs() for inbox in actions):
                    return False  # every listener must have matched its publisher first
                msgs = actions[2].msgs()
                return len(msgs) >= 2 * horizon and step_of(msgs[-1]) == 2

            wait_until(mid_chunk, 30, "probe2 in the middle of a chunk (step 2 of 6)")
            t_kill = time.monotonic()
            doomed.proc.kill()  # SIGKILL: the trainer dies without a close frame
            doomed.wait(10)
            # the trainer stays down for a second (the fault's duration), then restarts on the same port
            wait_until(lambda: time.monotonic() > t_kill + 1.0, 5, "the trainer's downtime")
            while_down = [inbox.msgs(t_kill) for inbox in actions]
            t_restart = time.monotonic()
            trainer = TrainerThread(
                trainer_settings(port=port, script=("resync", "stop"), horizon=horizon, n_envs=n_envs)
            )
            trainer.start()
            code = bridge_child.wait(60)
            report = trainer.report(30)
            output = bridge_child.output()
            after = [inbox.timed(t_restart) for inbox in actions]
    assert code == 0, output
    assert_clean(report, output)
    assert "cannot reach the trainer" in output, "the bridge did not retry while the trainer was down"
    for env, msgs in enumerate(while_down):
        # one step published in the instant before the bridge saw the connection drop is the most
        # the robot may get from a dead trainer's chunk
        assert len(msgs) <= 1, f"probe{env} got steps {[step_of(m) for m in msgs]} after the trainer died"
    for env, timed in enumerate(after):
        assert timed, f"probe{env} never stepped after the restart"
        t_first, first = timed[0]
        assert step_of(first) == 0, "after the restart the robot continued the lost chunk"
        # reconnect_max_s 0.5 caps the retries: an uncapped doubling would be far past this loose bound
        assert t_first - t_restart < 10.0, f"first step {t_first - t_restart:.1f} s after the restart"


# -- 2. the network stalls, then breaks ----------------------------------------------------


class StallingProxy:
    """A TCP proxy between the bridge and the trainer, on its own event loop thread.

    :meth:`stall` makes it stop reading from both sides (nothing is forwarded,
    as on a link that went dead without a reset); :meth:`cut` then aborts every
    connection (RST), and new connections flow again.
    """

    def __init__(self, upstream_port: int) -> None:
        self._upstream = upstream_port
        self._loop = asyncio.new_event_loop()
        self._flowing = asyncio.Event()
        self._writers: list[asyncio.StreamWriter] = []
        self.connections = 0
        self._server: asyncio.AbstractServer | None = None
        self._ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name="stalling-proxy", daemon=True)

    def start(self) -> StallingProxy:
        self._thread.start()
        self._ready.result(timeout=10)
        return self

    @property
    def uri(self) -> str:
        return f"ws://127.0.0.1:{self._ready.result(timeout=10)}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._flowing.set()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self._ready.set_result(self._server.sockets[0].getsockname()[1])
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream)
        except OSError:  # the trainer is not up: the bridge sees its connection refused
            writer.transport.abort()
            return
        self.connections += 1  # connections that reached the trainer
        self._writers += [writer, up_writer]
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)
        for w in (writer, up_writer):
            w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await self._flowing.wait()
            data = await reader.read(65536)
            if not data:
                break
            await self._flowing.wait()  # read just before a stall: held, as if still on the wire
            writer.write(data)
            await writer.drain()
        writer.close()

    def _call(self, fn: Callable[[], None]) -> None:
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            fn()
            done.set_result(None)

        self._loop.call_soon_threadsafe(run)
        done.result(timeout=5)

    def stall(self) -> None:
        self._call(self._flowing.clear)

    def cut(self) -> None:
        def abort_all() -> None:
            for w in self._writers:
                w.transport.abort()
            self._writers.clear()
            self._flowing.set()

        self._call(abort_all)

    def stop(self) -> None:
        def close() -> None:
            assert self._server is not None
            self._server.close()
            for w in self._writers:
                w.transport.abort()
            self._flowing.set()
            self._loop.stop()

        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(close)
            self._thread.join(10)


@contextmanager
def stalling_proxy(upstream_port: int) -> Iterator[StallingProxy]:
    proxy = StallingProxy(upstream_port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def test_a_stalled_then_cut_link_idles_the_robot_once_its_chunk_is_done_and_training_resumes_cleanly(robot):
    n_envs, horizon = 2, 4
    actions = [robot.listen(Float64MultiArray, f"/probe{i}/action") for i in range(n_envs)]
    port = free_port()
    trainer = TrainerThread(
        trainer_settings(port=port, script=("stop",), feedbacks_per_connection=40, horizon=horizon, n_envs=n_envs)
    )
    with stalling_proxy(port) as proxy:
        with probe_robot(n_envs), probe_bridge(proxy.uri, n_envs, mode="timer", rate=50.0) as bridge_child:
            wait_for_actuators(robot, n_envs)
            trainer.start()
            wait_until(lambda: all(len(a) >= 3 * horizon for a in actions), 30, "three chunks on each env")
            t_stall = time.monotonic()
            proxy.stall()
            # the link stays dead for two seconds (the fault's duration), then breaks
            wait_until(lambda: time.monotonic() > t_stall + 2.0, 5, "the stall")
            during = [a.timed(t_stall) for a in actions]
            t_cut = time.monotonic()
            proxy.cut()
            code = bridge_child.wait(60)
            report = trainer.report(30)
            output = bridge_child.output()
            after = [a.timed(t_cut) for a in actions]
    assert code == 0, output
    assert_clean(report, output)
    assert proxy.connections == 2, f"{proxy.connections} connections through the proxy"
    for env in range(n_envs):
        steps = [step_of(m) for _, m in during[env]]
        # at most what was already under way: the rest of the running chunk (an action that crossed
        # the proxy just before the stall may start one more)
        assert len(steps) <= 2 * horizon, f"probe{env} kept stepping through the stall: {steps}"
        late = [round(t - t_stall, 2) for t, _ in during[env] if t > t_stall + 0.5]
        assert not late, f"probe{env} was commanded {late} s into the stall, long after its chunk was done"
        assert after[env] and step_of(after[env][0][1]) == 0, "after the cut the robot did not start a new chunk"


# -- 3. every way the trainer closes, through the whole deployment --------------------------


def run_probe(settings: TrainerSettings, *args: str) -> tuple[int, Report, str]:
    """``plugrl-probe`` (probe robot + bridge from config/probe.yaml) against the test trainer."""
    trainer = TrainerThread(settings)
    trainer.start()
    with process(python_module("plugrl_ros.tools.probe", "--server", trainer.uri, *args)) as probe:
        code = probe.wait(90)
        return code, trainer.report(30), probe.output()


def test_the_probe_deployment_reconnects_after_resync_timeout_crash_and_drop_closes_with_every_transition_clean():
    # test_probe_ros covers resync, timeout and stop; 1011 and a dropped TCP connection complete the set
    settings = trainer_settings(
        script=("resync", "timeout", "crash", "drop", "stop"), feedbacks_per_connection=8, n_envs=3
    )
    code, report, output = run_probe(settings, "--envs", "3", "--mode", "timer", "--rate", "50")
    assert code == 0, output
    assert_clean(report, output)
    assert report.connections == 5, report.text()  # one per entry of the script: the probe connects only once
    assert report.clause(RECONNECTS).passed == 4, report.text()  # each new connection began with an infer
    assert report.clause(STOP_EXITS).passed == 1, report.text()
    for close in ("Internal server error.", "dropped without a close frame", "Feedback timeout"):
        assert close in output, f"the bridge did not see the close {close!r}"


def test_a_text_frame_after_a_crash_and_a_drop_ends_the_lockstep_probe_with_status_1():
    settings = trainer_settings(
        script=("crash", "drop", "text"), feedbacks_per_connection=8, n_envs=2, features=("reuse-feedback-obs",)
    )
    code, report, output = run_probe(settings, "--envs", "2", "--mode", "lockstep")
    assert code == 1, output
    assert_clean(report, output)
    assert report.clause(TEXT_FATAL).passed >= 2, report.text()  # nothing sent after it, and closed
    assert "stopping: the trainer sent a text frame" in output


# -- 4. the trainer is not up yet ------------------------------------------------------------


class ClosingListener:
    """Accepts TCP connections on ``port`` and closes each at once (a port forward with no trainer behind it),
    recording when each attempt came."""

    def __init__(self, port: int) -> None:
        self.attempts: list[float] = []
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(16)
        self._sock.settimeout(0.05)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="closing-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.attempts.append(time.monotonic())
            connection.close()

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._sock.close()


def test_a_bridge_started_before_its_trainer_retries_with_capped_backoff_then_trains_cleanly(robot):
    n_envs = 2
    port = free_port()
    actions = [robot.listen(Float64MultiArray, f"/probe{i}/action") for i in range(n_envs)]
    with probe_robot(n_envs), probe_bridge(f"ws://127.0.0.1:{port}", n_envs) as bridge_child:
        wait_for_actuators(robot, n_envs)
        wait_until(lambda: "ConnectionRefusedError" in bridge_child.output(), 20, "a refused connection attempt")
        t_refused = time.monotonic()
        # refused for a second (the backoff grows to its cap), then the port accepts and closes at
        # once for a while (a port forward with no trainer behind it): every attempt is seen
        wait_until(lambda: time.monotonic() > t_refused + 1.0, 5, "a second of refusals")
        listener = ClosingListener(port)
        t_listen = time.monotonic()
        try:
            wait_until(lambda: time.monotonic() > t_listen + 2.5, 5, "the listener's time")
        finally:
            listener.close()
        t_start = time.monotonic()
        trainer = TrainerThread(trainer_settings(port=port, script=("resync", "stop"), n_envs=n_envs))
        trainer.start()
        code = bridge_child.wait(60)
        report = trainer.report(30)
        output = bridge_child.output()
    assert code == 0, output
    assert_clean(report, output)
    for env, inbox in enumerate(actions):
        timed = inbox.timed()
        assert timed and timed[0][0] > t_start, f"probe{env} was commanded before there was a trainer"
        assert step_of(timed[0][1]) == 0
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(listener.attempts)]
    # reconnect_max_s 0.5 with equal jitter: once the backoff has grown to its cap (it had a second
    # of refusals to grow) every retry waits between 0.25 and 0.5 s: no hammering, no giving up.
    # Wide bands: a loaded machine delays attempts (and this listener's noticing them), never hastens them.
    assert len(gaps) >= 3, f"{len(listener.attempts)} attempts in 2.5 s: {gaps}"
    assert all(0.15 <= gap <= 1.5 for gap in gaps), f"retry gaps {gaps}"


# -- 5. a sensor goes silent ------------------------------------------------------------------


def reward_per_command(robot: Robot, ns: str) -> tuple[Inbox, Callable[[bool], None]]:
    """The robot answers every command on ``ns``/cmd with a reward equal to the command's value.

    Returns the command inbox and a switch that silences (False) or restores (True) the reward topic.
    """
    reward = robot.publisher(Float32, f"{ns}/reward")
    on = [True]

    def answer(msg: Float64MultiArray) -> None:
        if on[0]:
            reward.publish(Float32(data=float(msg.data[0])))

    def switch(value: bool) -> None:
        on[0] = value

    return robot.listen(Float64MultiArray, f"{ns}/cmd", then=answer), switch


def chunk_steps(cmd: Inbox, since: float, until: float) -> list[float]:
    """The chunk steps (non-zero commands; idle is zero or nothing) a robot received between two moments."""
    return [m.data[0] for t, m in cmd.timed(since) if t < until and m.data[0] != 0.0]


def test_a_chunk_cut_by_a_silent_sensor_is_fed_back_with_the_fresh_observation_and_the_reward_of_its_steps(
    tmp_path, robot
):
    horizon = 25  # half a second: the silence is noticed in the middle of a chunk
    params = {
        "envs": ["robot1", "robot2"],
        # the robot is fine, only a sensor is silent: however long the test takes, no env failure
        "control": {"env_timeout_s": 0.0},
        "observations": {"states": {"pos": {"topic": "state", "type": "std_msgs/Float64MultiArray", "max_age_s": 0.2}}},
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
        # once per step: a step's reward is never late, however loaded the machine
        "reward": {"topic": "reward", "type": "std_msgs/Float32", "sync": True},
    }
    robot.stream(Float64MultiArray, "/robot1/state", float_state(1.0))
    sensor2 = robot.stream(Float64MultiArray, "/robot2/state", float_state(2.0))
    cmd1, _ = reward_per_command(robot, "/robot1")
    cmd2, _ = reward_per_command(robot, "/robot2")
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    with ScriptedTrainer({"action_horizon": horizon, "action_dim": 1}, per_env_chunk(horizon)) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            # Both robots running (an env that missed the first infer could only join once robot2's
            # chunk ends, which a silent sensor delays), then silence robot2's sensor early in a chunk.
            wait_until(lambda: len(chunk_steps(cmd1, 0, math.inf)) >= horizon, 30, "robot1 running its chunks")
            wait_until(lambda: chunk_steps(cmd2, 0, math.inf)[-1:] == [202.0], 30, "robot2 at step 2 of a chunk")
            sensor2.on = False
            t_silent = time.monotonic()
            t_stale, _ = first_diag(
                diagnostics,
                lambda m: env_status(m, 1)[0] == WARN and "stale" in env_status(m, 1)[1],
                10,
                "/diagnostics to report env 1 stale",
                since=t_silent,
            )
            wait_until(lambda: len(chunk_steps(cmd1, t_stale, math.inf)) >= 25, 10, "env 0 stepping meanwhile")
            t_back = time.monotonic()
            sensor2.make = float_state(3.0)
            sensor2.on = True
            trainer.wait_for(
                lambda r: [t for t, m in with_env(trainer.timed_records(), "infer", 1) if t > t_back],
                10,
                "env 1 inferring again",
            )
            records = trainer.timed_records()
    feedbacks = with_env(records, "feedback", 1)
    infers = with_env(records, "infer", 1)
    t_feedback, cut = next((t, m) for t, m in feedbacks if t > t_silent)
    t_infer = max(t for t, _ in infers if t < t_feedback)
    assert t_feedback > t_back, "env 1's chunk ended while its sensor was silent"
    row = env_rows(cut)[1]
    steps = chunk_steps(cmd2, t_infer, t_feedback)
    assert steps == [200.0 + k for k in range(len(steps))], f"robot2's chunk steps out of order: {steps}"
    assert 1 <= len(steps) < horizon, f"the chunk was not cut: {len(steps)} of {horizon} steps ran"
    data = cut["data"]
    assert state_of(cut, 1).tolist() == [3.0], "the feedback carries the stale observation, not the fresh one"
    assert data["rewards"][row] == pytest.approx(sum(steps)), "the reward is not the sum over the steps that ran"
    assert not data["terminated"][row] and not data["truncated"][row], "a stale sensor does not end the episode"
    resumed = next(m for t, m in infers if t > t_feedback)
    assert resumed["step_ids"][env_rows(resumed)[1]] == cut["step_ids"][row] + 1, "the episode did not go on"
    assert state_of(resumed, 1).tolist() == [3.0]
    # env 0 was never held up
    assert len(chunk_steps(cmd1, t_stale, t_back)) >= 25


# -- 6. the reward goes silent -----------------------------------------------------------------

REWARDED = {
    "envs": ["robot1", "robot2"],
    "observations": {"states": {"pos": {"topic": "state", "type": "std_msgs/Float64MultiArray"}}},
    "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero"}},
}


def feedbacks_within(records: list, env: int, since: float, until: float = math.inf) -> list[tuple[float, dict]]:
    """``env``'s feedbacks whose whole chunk (from the infer before it) lies between two moments."""
    infers = [t for t, _ in with_env(records, "infer", env)]
    out = []
    for t, m in with_env(records, "feedback", env):
        asked = max((ti for ti in infers if ti < t), default=-math.inf)
        if asked > since and t < until:
            out.append((t, m))
    return out


# In timer mode a reward that is not once per step (sync) counts for the step during which it arrives:
# on a loaded machine one may land a tick late, in the next chunk. Chunks this long after a switch are
# clear of it.
LATE_S = 0.2


def reward_of(message: dict, env: int) -> float:
    return float(message["data"]["rewards"][env_rows(message)[env]])


def test_without_a_reward_age_limit_a_silent_reward_topic_lets_the_env_step_on_earning_zero(tmp_path, robot):
    horizon = 5
    params = merged(REWARDED, {"reward": {"topic": "reward", "type": "std_msgs/Float32", "max_age_s": 0.0}})
    robot.stream(Float64MultiArray, "/robot1/state", float_state(1.0))
    robot.stream(Float64MultiArray, "/robot2/state", float_state(2.0))
    cmd1, _ = reward_per_command(robot, "/robot1")
    cmd2, reward2 = reward_per_command(robot, "/robot2")
    with ScriptedTrainer({"action_horizon": horizon, "action_dim": 1}, per_env_chunk(horizon)) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):

            def chunks_after(env: int, since: float, n: int) -> bool:
                return len(feedbacks_within(trainer.timed_records(), env, since)) >= n

            wait_until(lambda: chunks_after(1, 0, 2), 30, "env 1's first chunks")
            # (a reward published before DDS matched the bridge's subscription is lost: judge from here)
            t_matched = time.monotonic()
            wait_until(lambda: chunks_after(1, t_matched, 2), 10, "env 1's chunks with rewards flowing")
            t_off = time.monotonic()
            reward2(False)
            wait_until(lambda: chunks_after(1, t_off + LATE_S, 4), 10, "env 1's chunks while its reward is silent")
            t_on = time.monotonic()
            reward2(True)
            wait_until(lambda: chunks_after(1, t_on + LATE_S, 2), 10, "env 1's chunks after its reward returned")
            records = trainer.timed_records()
    before = feedbacks_within(records, 1, t_matched, t_off)
    silent = feedbacks_within(records, 1, t_off + LATE_S, t_on)
    after = feedbacks_within(records, 1, t_on + LATE_S)
    assert before and all(reward_of(m, 1) > 0 for _, m in before)
    assert len(silent) >= 4 and [reward_of(m, 1) for _, m in silent] == [0.0] * len(silent)
    assert len(chunk_steps(cmd2, t_off, t_on)) >= 4 * horizon, "env 1 stopped stepping"
    assert after and all(reward_of(m, 1) > 0 for _, m in after)
    # env 0 earned its reward all along
    assert all(reward_of(m, 0) > 0 for _, m in feedbacks_within(records, 0, t_matched))
    assert len(chunk_steps(cmd1, t_off, t_on)) >= 4 * horizon


def test_with_a_reward_age_limit_a_silent_reward_topic_idles_that_env_alone_until_the_reward_returns(tmp_path, robot):
    horizon = 5
    params = merged(
        REWARDED,
        {
            "control": {"env_timeout_s": 0.0},  # stale, not failed, however long the test takes
            "reward": {"topic": "reward", "type": "std_msgs/Float32", "max_age_s": 0.3},
        },
    )
    robot.stream(Float64MultiArray, "/robot1/state", float_state(1.0))
    robot.stream(Float64MultiArray, "/robot2/state", float_state(2.0))
    cmd1, _ = reward_per_command(robot, "/robot1")
    cmd2, reward2 = reward_per_command(robot, "/robot2")
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    with ScriptedTrainer({"action_horizon": horizon, "action_dim": 1}, per_env_chunk(horizon)) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)):
            wait_until(lambda: len(chunk_steps(cmd1, 0, math.inf)) >= 2 * horizon, 30, "env 0 stepping")
            wait_until(lambda: len(chunk_steps(cmd2, 0, math.inf)) >= 2 * horizon, 30, "env 1 stepping")
            t_off = time.monotonic()
            reward2(False)
            t_stale, diag = first_diag(
                diagnostics,
                lambda m: env_status(m, 1)[0] == WARN and "reward" in env_status(m, 1)[1],
                10,
                "/diagnostics to report env 1's reward stale",
                since=t_off,
            )
            wait_until(lambda: len(chunk_steps(cmd1, t_stale, math.inf)) >= 4 * horizon, 10, "env 0 stepping")
            idle_window = cmd2.timed(t_stale + 0.05)
            t_on = time.monotonic()
            reward2(True)
            wait_until(lambda: len(chunk_steps(cmd2, t_on, math.inf)) >= 2 * horizon, 10, "env 1 stepping again")
            resumed = trainer.wait_for(
                lambda r: [m for t, m in with_env(trainer.timed_records(), "infer", 1) if t > t_on], 10, "an infer"
            )
    level, message, _ = env_status(diag, 1)
    assert level == WARN
    assert "robot2/reward" in message and "stale" in message, message
    assert env_status(diag, 0)[0] == OK, env_status(diag, 0)
    assert len(idle_window) >= 10, "idle zero must go on publishing while the env is stale"
    assert all(m.data[0] == 0.0 for _, m in idle_window), "env 1 stepped while its reward was stale"
    assert resumed, "env 1 did not ask for a new chunk after its reward returned"


# -- 7. the terminated flag flaps --------------------------------------------------------------


def flapping(rng: random.Random) -> Iterator[bool]:
    while True:
        if rng.random() < 0.08:
            yield from (True, False, True)
        else:
            yield False


def test_a_flapping_terminated_topic_ends_episodes_cleanly_with_chunk_sums_and_fresh_step_ids(tmp_path, robot):
    horizon = 3
    params = {
        "observations": {"states": {"pos": {"topic": "state", "type": "std_msgs/Float64MultiArray"}}},
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
        "reward": {"topic": "reward", "type": "std_msgs/Float32", "sync": True},  # once per step
        "episode": {"terminated_topic": "terminated"},  # not once per step: it flaps on its own
    }
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    cmd, _ = reward_per_command(robot, "")
    # 200 Hz: false, with bursts of true, false, true at random moments (about one every 60 ms);
    # random, so that the episodes cannot fall in step with the flapping
    flaps = flapping(random.Random(3))
    robot.stream(Bool, "/terminated", lambda: Bool(data=next(flaps)), period_s=0.005)
    with ScriptedTrainer({"action_horizon": horizon, "action_dim": 1}, per_env_chunk(horizon)) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:

            def terminal_feedbacks(records: list) -> int:
                return sum(bool(m["data"]["terminated"][0]) for m in of_kind(records, "feedback"))

            trainer.wait_for(lambda r: terminal_feedbacks(r) >= 15, 40, "15 terminal feedbacks")
            assert child.proc.poll() is None, "the bridge died"
            messages = [m for _, m in trainer.records()]
            steps = chunk_steps(cmd, 0, math.inf)
            output = child.output()
    assert "Traceback" not in output and "[ERROR]" not in output, output
    ran: list[int] = []  # steps of each chunk fed back
    episode_reward = 0.0
    infer, terminals = None, 0
    for i, message in enumerate(messages):
        if message["message_type"] == "infer":
            infer = message
            continue
        data, step_id = message["data"], int(message["step_ids"][0])
        assert infer is not None and int(infer["step_ids"][0]) == step_id
        terminated = bool(data["terminated"][0])
        assert not data["truncated"][0]
        episode = data["info"].get("episode")  # info may be {} when no row ends an episode
        assert episode is not None or not terminated, "a terminal feedback without info['episode']"
        if episode is not None:
            assert episode["mask"].tolist() == [terminated]
        n = int(episode["l"][0]) - horizon * step_id if terminated else horizon
        assert 1 <= n <= horizon, f"a chunk of {n} steps"
        reward = float(data["rewards"][0])
        assert reward == sum(100 + k for k in range(n)), f"reward {reward} is not the sum over {n} steps"
        episode_reward += reward
        if terminated:
            terminals += 1
            assert float(episode["r"][0]) == pytest.approx(episode_reward), "the episode's return"
            episode_reward = 0.0
        ran.append(n)
        infer = None
        following = next((m for m in messages[i + 1 :] if m["message_type"] == "infer"), None)
        if following is not None:
            expected = 0 if terminated else step_id + 1
            assert int(following["step_ids"][0]) == expected, f"step_ids {following['step_ids']} after a feedback"
    assert terminals >= 15 and min(ran) < horizon, "no episode ended in the middle of a chunk"
    # the robot got exactly the steps the trainer was told ran, chunk after chunk, in order
    chunks: list[list[float]] = []
    for value in steps:
        if value == 100.0 or not chunks:
            chunks.append([])
        chunks[-1].append(value)
    assert all(c == [100.0 + k for k in range(len(c))] for c in chunks), steps
    assert [len(c) for c in chunks[: len(ran)]] == ran, (ran, steps)


# -- 8. a reset hangs ---------------------------------------------------------------------------


class SlowReset:
    """A std_srvs/Trigger reset service whose calls answer only after ``hang_s`` (0: at once).

    It has a node, a context and a multi-threaded executor of its own, so a hanging call blocks
    neither the fake robot nor the next call (which is how a robot's reset server behaves).
    """

    def __init__(self, name: str, hang_s: float) -> None:
        self.hang_s = hang_s
        self.calls: list[float] = []
        self._released = threading.Event()
        self.context = Context()
        rclpy.init(context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node("slow_reset", context=self.context)
        self.node.create_service(Trigger, name, self._handle, callback_group=ReentrantCallbackGroup())
        self.executor = MultiThreadedExecutor(num_threads=8, context=self.context)  # calls hang side by side
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, name="slow-reset", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except ExternalShutdownException:
            pass

    def _handle(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        self.calls.append(time.monotonic())
        if self.hang_s:
            self._released.wait(self.hang_s)  # the fault: no answer for hang_s
        response.success = True
        response.message = "home"
        return response

    def recover(self) -> None:
        """The server recovers: the calls hanging now are answered, and every later one at once."""
        self.hang_s = 0.0
        self._released.set()

    def close(self) -> None:
        self._released.set()
        self.executor.shutdown(timeout_sec=5)
        self._thread.join(5)
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)


@contextmanager
def slow_reset(name: str, hang_s: float) -> Iterator[SlowReset]:
    service = SlowReset(name, hang_s)
    try:
        yield service
    finally:
        service.close()


def test_a_hanging_reset_is_timed_out_and_retried_with_backoff_while_the_other_env_keeps_training(tmp_path, robot):
    hang_s = 20.0  # far longer than a timed-out call's retry takes, loaded machine or not
    params = {
        "envs": ["robot1", "robot2"],
        "observations": {"states": {"pos": {"topic": "state", "type": "std_msgs/Float64MultiArray"}}},
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
        "episode": {"max_steps": 4},
        "reset": {"mode": "service", "timeout_s": 0.5, "retry_initial_s": 0.2, "retry_max_s": 1.0},
    }
    robot.stream(Float64MultiArray, "/robot1/state", float_state(1.0))
    robot.stream(Float64MultiArray, "/robot2/state", float_state(2.0))

    def reset_now(request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success = True
        return response

    robot.node.create_service(Trigger, "/robot2/reset", reset_now)
    cmd1, cmd2 = robot.listen(Float64MultiArray, "/robot1/cmd"), robot.listen(Float64MultiArray, "/robot2/cmd")
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")

    def env1_trained_since(t: float) -> bool:
        feedbacks = [u for u, _ in with_env(trainer.timed_records(), "feedback", 1) if u > t]
        return len(cmd2.msgs(t)) >= 10 and len(feedbacks) >= 4

    with slow_reset("/robot1/reset", hang_s=hang_s) as reset1:
        with ScriptedTrainer({"action_horizon": 2, "action_dim": 1}, per_env_chunk(2)) as trainer:
            with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
                wait_until(lambda: len(reset1.calls) >= 3, 30, "three calls of robot1's hanging reset")
                first = reset1.calls[0]
                wait_until(lambda: env1_trained_since(first), 30, "robot2 training while robot1's reset hangs")
                _, hanging = first_diag(
                    diagnostics,
                    lambda m: "no answer from" in env_status(m, 0)[1],
                    5,
                    "/diagnostics to report the hanging reset",
                )
                t_release = time.monotonic()
                reset1.recover()  # the reset server answers the call in progress, and the next ones at once
                resumed = trainer.wait_for(
                    lambda r: next(
                        (m for t, m in with_env(trainer.timed_records(), "infer", 0) if t > t_release), None
                    ),
                    10,
                    "env 0 inferring after its reset was answered",
                )
                output = child.output()
    # What the bridge decided, in its words (exact under any load): each call timed out after
    # timeout_s, then retried after retry_initial_s 0.2, doubling.
    timeouts = [line for line in output.splitlines() if "no answer from robot1/reset within 0.5 s" in line]
    delays = reset_retry_delays(output, "robot1/reset")
    assert len(timeouts) >= 2 and delays[:2] == [0.2, 0.4], output
    # ...and honoured: each next call came after its delay (never before: load only delays it), and
    # long before the hanging call would have answered (it was not waited for).
    calls = [t for t in reset1.calls if t < t_release]
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert all(delay < gap < hang_s for gap, delay in zip(gaps, delays, strict=False)), (gaps, delays)
    level, message, _ = env_status(hanging, 0)
    assert level == WARN and "no answer from robot1/reset within 0.5 s" in message, message
    assert env_status(hanging, 1)[0] == OK, env_status(hanging, 1)
    assert resumed["step_ids"][env_rows(resumed)[0]] == 0, "a new episode starts after the reset"
    assert not [t for t, _ in cmd1.timed(first + 0.05) if t < t_release], "robot1 was commanded while resetting"
    assert env1_trained_since(first), "robot2 did not keep training"
    assert "Traceback" not in output, output


# -- 9. the robot process dies and comes back -----------------------------------------------------


def test_a_robot_that_dies_mid_run_and_comes_back_is_failed_reset_and_resumed_with_no_transition_spanning_it(robot):
    n_envs = 3
    actions = [robot.listen(Float64MultiArray, f"/probe{i}/action") for i in range(n_envs)]
    # "serve": the trainer checks everything until the bridge leaves; grace_s covers the bridge's
    # reopening of the connection when a robot fails during the first step of a chunk.
    # Chunks of 8 hold a whole probe episode (3, 5 or 7 steps); the step ids after a chunk that
    # failed in its first step and the probe robot's silence between steps have tests below.
    trainer = TrainerThread(trainer_settings(script=("serve",), n_envs=n_envs, horizon=8, grace_s=3.0))
    trainer.start()
    with probe_bridge(trainer.uri, n_envs, mode="timer", rate=50.0) as bridge_child:
        with probe_robot(n_envs) as first_robot:
            wait_for_actuators(robot, n_envs)
            wait_until(lambda: all(len(a) >= 20 for a in actions), 30, "the probe envs stepping")
            first_robot.stop()  # the robot process goes away in the middle of everything
        t_dead = time.monotonic()
        # it stays away for two seconds (the fault's duration): longer than control.env_timeout_s
        wait_until(lambda: time.monotonic() > t_dead + 2.0, 5, "the robot's downtime")
        t_back = time.monotonic()
        with probe_robot(n_envs):
            wait_until(lambda: all(len(a.msgs(t_back)) >= 20 for a in actions), 30, "the new robot stepping")
            code = bridge_child.stop()
            output = bridge_child.output()
        report = trainer.report(30)
    assert code == 0, output
    assert_clean(report, output)
    for env in range(n_envs):
        noticed = (f"env {env}: no step result for 1 s", f"reset of probe{env}/reset failed")
        assert any(line in output for line in noticed), f"env {env}'s failure was not noticed"
        # while the robot was away no chunk went past a step whose result had not come back
        late = [step_of(m) for t, m in actions[env].timed(t_dead + 0.05) if t < t_back]
        assert all(k == 0 for k in late), f"probe{env} was driven through a chunk with nobody there: {late}"
        first = actions[env].msgs(t_back)[0]
        assert step_of(first) == 0, "the new robot was handed the middle of an old chunk"
    assert "is not available" in output, "no reset was tried while the robot was away"


def test_after_the_robot_fails_in_the_first_step_of_a_chunk_its_next_episode_starts_at_step_ids_0(tmp_path, robot):
    horizon, max_steps = 2, 6
    params = {
        "control": {"mode": "lockstep", "env_timeout_s": 1.0},
        "observations": {"states": {"pos": {"topic": "state", "type": "std_msgs/Float64MultiArray"}}},
        "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "none"}},
        "reward": {"topic": "reward", "type": "std_msgs/Float32"},
        "episode": {"max_steps": max_steps},
        "reset": {"mode": "service", "timeout_s": 1.0, "retry_initial_s": 0.1, "retry_max_s": 0.5},
    }
    t = [0]  # steps since the robot's last reset: its observation
    state, reward = robot.publisher(Float64MultiArray, "/state"), robot.publisher(Float32, "/reward")
    # until the bridge's first infer the robot shows its state periodically; then only in answer to a step
    hello = robot.stream(Float64MultiArray, "/state", lambda: Float64MultiArray(data=[float(t[0])]))

    def step(msg: Float64MultiArray) -> None:
        if msg.data[0] == 3000.0:
            return  # the first step of the third chunk: the robot fails to answer it
        t[0] += 1
        state.publish(Float64MultiArray(data=[float(t[0])]))
        reward.publish(Float32(data=1.0))

    def reset(request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        t[0] = 0
        state.publish(Float64MultiArray(data=[0.0]))
        response.success = True
        return response

    robot.listen(Float64MultiArray, "/cmd", then=step)
    robot.node.create_service(Trigger, "/reset", reset)
    infers = itertools.count(1)

    def actions(env_indices, step_ids, observation):
        hello.on = False
        n = next(infers)  # chunk n's step k is worth 1000 * n + k
        return np.full((horizon, len(env_indices), 1), 1000.0 * n, dtype="<f4") + np.arange(horizon)[:, None, None]

    with ScriptedTrainer({"action_horizon": horizon, "action_dim": 1}, actions) as trainer:
        with bridge(tmp_path, bridge_params(trainer.uri, **params)) as child:
            assert trainer.wait_closed(0, 30)[0] == 1000, "the connection holding the failed chunk was not reopened"
            trainer.wait_for(
                lambda r: any(m["data"]["truncated"][0] for m in of_kind(r, "feedback", connection=1)),
                20,
                "an episode truncated at max_steps after the reconnect",
            )
            records = trainer.records()
            output = child.output()
    assert "during the first step of a chunk; reopening the trainer connection" in output, output
    first_infer = of_kind(records, "infer", connection=1)[0]
    assert first_infer["step_ids"].tolist() == [0], "the episode after the reset did not start at step_ids 0"
    truncated = next(m for m in of_kind(records, "feedback", connection=1) if m["data"]["truncated"][0])
    episode = truncated["data"]["info"]["episode"]
    assert truncated["step_ids"].tolist() == [max_steps // horizon - 1]
    assert episode["l"].tolist() == [max_steps] and episode["r"].tolist() == [float(max_steps)]


def test_the_probe_robot_publishes_a_state_only_in_answer_to_an_action_or_a_reset(robot):
    states = robot.listen(Float64, "/probe0/t")
    action = robot.publisher(Float64MultiArray, "/probe0/action")
    with probe_robot(1):
        robot.discover(Trigger, "/probe0/reset")
        assert robot.call(Trigger, "/probe0/reset", Trigger.Request()).success
        wait_until(lambda: len(states) == 1, 30, "the probe robot's answer to a reset (its first observation)")

        def step() -> None:
            before = len(states)
            action.publish(Float64MultiArray(data=[1.0, 2.0]))
            wait_until(lambda: len(states) > before, 10, "the probe robot's answer to an action")

        for _ in range(3):
            step()
        answered = len(states) - 1
        watcher = robot.listen(Float64, "/probe0/t")  # someone runs `ros2 topic echo /probe0/t`
        # the bridge goes on stepping at 50 Hz until the watcher has been hearing the robot for 0.4 s
        while not watcher.timed() or time.monotonic() < watcher.timed()[0][0] + 0.4:
            t_step = time.monotonic()
            step()
            answered += 1
            wait_until(lambda t_step=t_step: time.monotonic() > t_step + 0.02, 1, "the next control tick")
    unsolicited = len(states) - 1 - answered
    assert unsolicited == 0, f"{unsolicited} state message(s) that no action or reset caused"


# -- 10. Ctrl-C at any moment --------------------------------------------------------------------

SIGNALLED = {
    "observations": {"states": {"pos": {"topic": "state", "type": "std_msgs/Float64MultiArray"}}},
    "actions": {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero"}},
    "episode": {"max_steps": 50},
    "reset": {"mode": "service", "timeout_s": 3.0, "retry_initial_s": 0.1, "retry_max_s": 0.5},
}
HORIZON = 25  # half a second of 0.5 commands per chunk, two chunks per episode, then a reset of a second


def half_speed(env_indices, step_ids, observation):
    return np.full((HORIZON, len(env_indices), 1), 0.5, dtype="<f4")


MOMENTS: dict[str, Callable[[Inbox, ScriptedTrainer, SlowReset], Any]] = {
    # nothing listens on the trainer's port yet: the bridge is between connection attempts
    "connecting": lambda cmd, trainer, reset: len(cmd) >= 3,
    # connected, the trainer has not sent its metadata yet
    "awaiting-metadata": lambda cmd, trainer, reset: trainer.connections >= 1,
    "mid-chunk": lambda cmd, trainer, reset: sum(m.data[0] == 0.5 for m in cmd.msgs()) >= 5,
    # the reset service has been called and has not answered yet
    "during-reset": lambda cmd, trainer, reset: len(reset.calls) >= 1,
}


@pytest.mark.parametrize(
    ("moment", "signum"),
    [
        pytest.param(moment, signum, id=f"{moment}-{signum.name}")
        for moment, signum in [
            ("connecting", signal.SIGINT),
            ("awaiting-metadata", signal.SIGTERM),
            ("mid-chunk", signal.SIGTERM),
            ("during-reset", signal.SIGINT),
            *((f"random-{seed}", (signal.SIGINT, signal.SIGTERM)[seed % 2]) for seed in range(4)),
        ]
    ],
)
def test_a_signal_at_any_moment_idles_the_actuators_closes_with_1000_and_exits_0_within_3_s(
    tmp_path, robot, moment, signum
):
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    cmd = robot.listen(Float64MultiArray, "/cmd")
    port = free_port() if moment == "connecting" else 0
    metadata_delay_s = 30.0 if moment == "awaiting-metadata" else 0.0
    trainer = ScriptedTrainer(
        {"action_horizon": HORIZON, "action_dim": 1}, half_speed, metadata_delay_s=metadata_delay_s
    )
    with slow_reset("/reset", hang_s=1.0) as reset, trainer:
        uri = f"ws://127.0.0.1:{port}" if port else trainer.uri
        with bridge(tmp_path, bridge_params(uri, **SIGNALLED)) as child:
            wait_until(lambda: len(cmd) >= 1, 30, "the control loop running (idle zeros)")
            if moment.startswith("random-"):
                delay = random.Random(moment).uniform(0.0, 2.5)
                t_up = time.monotonic()
                wait_until(lambda: time.monotonic() > t_up + delay, 5, f"{delay:.2f} s")
            else:
                wait_until(lambda: MOMENTS[moment](cmd, trainer, reset), 30, f"the moment {moment!r}")
            t_signal = time.monotonic()
            child.proc.send_signal(signum)
            code = child.wait(20)
            elapsed = time.monotonic() - t_signal
            output = child.output()
            opened = output.count("connected to the trainer at")
            closes = [trainer.wait_closed(c, 5) for c in range(trainer.connections)]
        # the bridge's last word to its actuator is idle (zero), never a step of a chunk
        wait_until(lambda: cmd.msgs(t_signal) and cmd.msgs()[-1].data[0] == 0.0, 5, "a zero command at the end")
    assert code == 0, output
    assert elapsed < STOP_BOUND_S, f"took {elapsed:.1f} s to stop"
    assert "Traceback" not in output, output
    if moment != "connecting":
        assert trainer.connections >= 1
    # every connection the bridge had opened was closed with 1000 (a handshake cut short never opened)
    assert [close_code for close_code, _ in closes[:opened]] == [1000] * opened, (closes, output)


def test_a_signal_while_the_trainer_link_is_stalled_still_exits_within_3_s(tmp_path, robot):
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    cmd = robot.listen(Float64MultiArray, "/cmd")
    with ScriptedTrainer({"action_horizon": HORIZON, "action_dim": 1}, half_speed) as trainer:
        # no reset service here: the env must run without a reset at startup
        unreset = merged(SIGNALLED, {"reset": {"on_start": False}})
        with stalling_proxy(trainer.port) as proxy, bridge(tmp_path, bridge_params(proxy.uri, **unreset)) as child:
            wait_until(lambda: sum(m.data[0] == 0.5 for m in cmd.msgs()) >= 5, 30, "a chunk running")
            proxy.stall()  # the link goes dead in the middle of the chunk
            t_stall = time.monotonic()
            wait_until(lambda: [m for m in cmd.msgs(t_stall) if m.data[0] == 0.0], 5, "the chunk done, idle")
            t_signal = time.monotonic()
            child.proc.send_signal(signal.SIGINT)
            code = child.wait(20)
            elapsed = time.monotonic() - t_signal
            output = child.output()
        wait_until(lambda: cmd.msgs()[-1].data[0] == 0.0, 5, "a zero command at the end")
    assert code == 0, output
    assert elapsed < STOP_BOUND_S, f"took {elapsed:.1f} s to stop on a stalled link"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_bridge_is_still_starting_exits_0_without_a_traceback(tmp_path, signum):
    params = write_params(tmp_path / "bridge.yaml", bridge_params("ws://127.0.0.1:9", **SIGNALLED))
    with process([*BRIDGE, "--ros-args", "--params-file", str(params)]) as child:
        t_start = time.monotonic()
        wait_until(lambda: time.monotonic() > t_start + 0.15, 5, "0.15 s into the bridge's start")
        child.proc.send_signal(signum)
        code = child.wait(20)
        output = child.output()
    assert code == 0, output
    assert "Traceback" not in output, output
