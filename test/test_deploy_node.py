"""Deploy mode with real processes: a fake robot node, the bridge node in policy mode, the test policy server.

The robot's state is the number of commands it has received so far, and the
bridge idles with ``zero`` (one message per tick either way), so the robot's
message count is the bridge's tick count up to a constant. The test policy
server writes into every row of a chunk ``[chunk number, row k, stamp]``
where the stamp is the state the chunk was computed from: row ``k`` of the
chunk for count ``c`` is meant for the robot's message ``c + k``. Everything
is judged by what the actuator's subscriber receives (and /diagnostics),
never by timing.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from harness import (
    DIAG_PREFIX,
    RATE_HZ,
    SET_PAUSED,
    Robot,
    bridge,
    env_status,
    first_diag,
    free_port,
    python_module,
    ros_env,
    wait_until,
)
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import SetBool

from plugrl_ros.tools.test_policy_server import decode_row, encoded_chunk

pytestmark = [pytest.mark.ros, pytest.mark.websockets]

WIDTH = 4
OFFSET = 1000
SERVER = python_module("plugrl_ros.tools.test_policy_server")


def deploy_params(port: int, mode: str, horizon: int, **policy) -> dict:
    return {
        "mode": "deploy",
        "control": {"rate_hz": RATE_HZ},
        "status": {"diagnostics_period_s": 0.2, "log_period_s": 1.0},
        "observations": {"states": {"count": {"topic": "count", "type": "std_msgs/Float64MultiArray"}}},
        "actions": {"arm": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, WIDTH], "idle": "zero"}},
        "policy": {
            "uri": f"ws://127.0.0.1:{port}",
            "reconnect_initial_s": 0.05,
            "reconnect_max_s": 0.2,
            "observations": {"observation": {"state": "states.count"}},
            "action_horizon": horizon,
            "action_dim": WIDTH,
            "execution": {"mode": mode},
            **policy,
        },
    }


class Server:
    """``plugrl-test-policy-server`` as a child process on ``port``."""

    def __init__(self, port: int, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*SERVER, "--port", str(port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ros_env(),
        )
        line = self.proc.stdout.readline()
        assert line.startswith("listening on"), (line, self.proc.stderr.read() if self.proc.poll() else "")

    def stop(self, sig: int = signal.SIGINT) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.communicate(timeout=30)


class CountingRobot:
    """Receives commands on ``cmd`` and publishes, on every one, how many it has received (the state ``count``)."""

    def __init__(self, robot: Robot, namespace: str = "") -> None:
        prefix = f"{namespace}/" if namespace else ""
        self.publisher = robot.publisher(Float64MultiArray, f"{prefix}count")
        self.inbox = robot.listen(Float64MultiArray, f"{prefix}cmd", self._on_command)
        self.received = 0
        robot.stream(Float64MultiArray, f"{prefix}count", lambda: Float64MultiArray(data=[float(self.count)]))

    def _on_command(self, _msg) -> None:
        self.received += 1
        self.publisher.publish(Float64MultiArray(data=[float(self.count)]))

    @property
    def count(self) -> int:
        """Commands received, plus an offset: a chunk's rows then never encode as all zeros (an idle step)."""
        return OFFSET + self.received

    def rows(self) -> list[np.ndarray]:
        return [np.asarray(m.data) for m in self.inbox.msgs()]


def decoded(rows: list[np.ndarray]) -> list[tuple[int, int, float] | None]:
    """Each message's (chunk, row, stamp), None for an idle (zero) message."""
    return [None if not row.any() else decode_row(row) for row in rows]


def idle_after_first_chunk(items: list) -> int:
    started = next(i for i, item in enumerate(items) if item is not None)
    return sum(item is None for item in items[started:])


def has_env_entry(msg: DiagnosticArray) -> bool:
    return any(status.name.startswith(f"{DIAG_PREFIX}: env 0") for status in msg.status)


def run_until_chunks(robot: Robot, tmp_path: Path, params: dict, chunks: int) -> tuple[list, dict[str, str]]:
    counting = CountingRobot(robot)
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    with bridge(tmp_path, params):
        wait_until(
            lambda: len({d[0] for d in decoded(counting.rows()) if d is not None}) >= chunks,
            240,
            f"{chunks} chunks applied",
        )
        since = time.monotonic()
        _, diag = first_diag(diagnostics, has_env_entry, 30, "diagnostics after the run", since=since)
        values = env_status(diag, 0)[2]
        rows = counting.rows()  # before the bridge stops (stopping idles the actuators)
    return decoded(rows), values


@pytest.mark.parametrize("mode", ["switch", "ensemble"])
def test_no_idle_step_at_chunk_boundaries_when_the_server_keeps_up(tmp_path, robot, mode):
    port = free_port()
    server = Server(port, "--horizon", "25", "--action-dim", str(WIDTH), "--latency", "0.04", "--jitter", "0.02")
    try:
        # the next chunk is asked for with 15 steps (300 ms) left: far more than the server's 40-60 ms
        params = deploy_params(port, mode, 25, execution={"mode": mode, "request_ahead_steps": 15})
        items, values = run_until_chunks(robot, tmp_path, params, 50)
    finally:
        server.stop()
    assert idle_after_first_chunk(items) == 0, [i for i, d in enumerate(items) if d is None]
    assert values["idle steps at boundaries"] == "0" and int(values["chunks"]) >= 50


def test_sync_execution_idles_at_every_chunk_boundary(tmp_path, robot):
    port = free_port()
    server = Server(port, "--horizon", "10", "--action-dim", str(WIDTH), "--latency", "0.06")
    try:
        items, values = run_until_chunks(robot, tmp_path, deploy_params(port, "sync", 10), 10)
    finally:
        server.stop()
    started = next(i for i, item in enumerate(items) if item is not None)
    runs = [item for item in items[started:]]
    boundaries = [i for i in range(1, len(runs)) if runs[i] is not None and runs[i - 1] is None]
    chunk_starts = [i for i in range(1, len(runs)) if runs[i] is not None and runs[i][1] == 0]
    assert chunk_starts and set(chunk_starts) <= set(boundaries)  # every new chunk comes after idle steps
    assert all(runs[i][1] == k for s in chunk_starts for k, i in enumerate(range(s, s + 10)) if i < len(runs))
    assert int(values["idle steps at boundaries"]) >= len(chunk_starts)


def test_no_request_goes_out_until_the_robot_subscribes_to_its_actuator(tmp_path, robot):
    """Commands sent before DDS matched the robot's subscriber would reach nobody: the bridge asks the
    policy for nothing until the actuator topic has a subscriber, and /diagnostics says why."""
    port = free_port()
    server = Server(port, "--horizon", "5", "--action-dim", str(WIDTH))
    robot.stream(Float64MultiArray, "count", lambda: Float64MultiArray(data=[float(OFFSET)]))
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    try:
        with bridge(tmp_path, deploy_params(port, "switch", 5)):
            _, diag = first_diag(
                diagnostics,
                lambda m: has_env_entry(m) and env_status(m, 0)[1] == "no subscriber on /cmd (commands would be lost)",
                30,
                "the robot reported waiting for a subscriber on /cmd",
            )
            level, _, values = env_status(diag, 0)
            assert level == 1 and values["requests"] == "0", values  # a warning, and nothing asked yet
            inbox = robot.listen(Float64MultiArray, "cmd")
            wait_until(lambda: sum(np.asarray(m.data).any() for m in inbox.msgs()) >= 10, 30, "two chunks applied")
            first_diag(diagnostics, lambda m: has_env_entry(m) and env_status(m, 0)[1] == "running", 30, "running")
    finally:
        server.stop()
    actions = [decode_row(np.asarray(m.data)) for m in inbox.msgs() if np.asarray(m.data).any()]
    # the robot's first action is from the first chunk the server computed (number 0), from its start
    # (row 0, or the row for the tick the answer arrived in: a loaded machine may take a tick or two)
    assert actions[0][0] == 0 and actions[0][1] <= 2, actions


@pytest.mark.parametrize("latency", ["0", "0.06", "0.15"])
def test_the_applied_row_is_the_one_computed_for_that_tick(tmp_path, robot, latency):
    port = free_port()
    jitter = str(float(latency) * 0.2)
    server = Server(port, "--horizon", "25", "--action-dim", str(WIDTH), "--latency", latency, "--jitter", jitter)
    try:
        items, _ = run_until_chunks(robot, tmp_path, deploy_params(port, "switch", 25), 15)
    finally:
        server.stop()
    # Message n carries row k of the chunk computed from count c: it was meant for message (c - OFFSET) + k,
    # up to how many commands the count lagged behind when the bridge read it (its delivery, not the bridge).
    offsets: dict[int, set[int]] = {}
    for n, item in enumerate(items):
        if item is not None:
            offsets.setdefault(item[0], set()).add(n - (round(item[2]) - OFFSET + item[1]))
    assert len(offsets) >= 15
    # within a chunk, every row lands exactly on its own tick: none skipped, none replayed
    assert all(len(seen) == 1 for seen in offsets.values()), offsets
    # The first chunk is not judged for its tick: commands the bridge published before DDS matched the
    # robot's subscriber were lost (seen on the Jazzy wheels: 16), so the robot's count lags behind.
    del offsets[min(offsets)]
    lags = [seen.pop() for seen in offsets.values()]
    assert min(lags) >= 0 and max(lags) <= 5, lags  # never early; a loaded machine may deliver the count late
    assert sum(lag <= 1 for lag in lags) >= 0.8 * len(lags), lags  # within one tick for most chunks


def test_ensemble_publishes_the_documented_weighted_average(tmp_path, robot):
    port = free_port()
    rate = 0.3
    server = Server(port, "--horizon", "12", "--action-dim", str(WIDTH), "--latency", "0.02")
    execution = {"mode": "ensemble", "ensemble_rate": rate, "request_ahead_steps": 8}
    params = deploy_params(port, "ensemble", 12, execution=execution)
    try:
        counting = CountingRobot(robot)
        with bridge(tmp_path, params):
            wait_until(lambda: len(counting.rows()) > 300, 120, "300 commands")
            rows = counting.rows()
    finally:
        server.stop()

    # Column 0 of a row is the chunk number. The chunks alive at a tick are consecutive requests j0 .. j0 + m,
    # weighted w_i = exp(-rate * i) with i = 0 the oldest, so the published value is j0 + f(m) with
    # f(m) = sum(i * w_i) / sum(w_i): its fractional part says how many chunks were averaged.
    def f(m: int) -> float:
        w = np.exp(-rate * np.arange(m + 1))
        return float((np.arange(m + 1) * w).sum() / w.sum())

    averaged = []
    for row in rows:
        if not row.any():
            continue
        fits = [m for m in range(6) if abs((row[0] - f(m)) - round(row[0] - f(m))) < 1e-6]
        assert fits, f"{row[0]!r} is no exponentially weighted mean of consecutive chunks (oldest first)"
        averaged.append(fits[0])
    assert len(averaged) > 200 and max(averaged) >= 1, averaged  # chunks did overlap and were averaged


def test_a_killed_server_idles_the_robot_and_a_restarted_one_resumes_it_with_no_stale_chunk(tmp_path, robot):
    port = free_port()
    args = ("--horizon", "25", "--action-dim", str(WIDTH), "--latency", "0.03")
    server = Server(port, *args)
    counting = CountingRobot(robot)
    try:
        with bridge(tmp_path, deploy_params(port, "switch", 25)):
            wait_until(lambda: sum(d is not None for d in decoded(counting.rows())) > 50, 120, "the robot moving")
            server.stop(signal.SIGKILL)
            killed_at = len(counting.rows())
            wait_until(lambda: decoded(counting.rows()[killed_at:]).count(None) >= 10, 60, "the robot idling")
            items = decoded(counting.rows())
            idle_from = next(n for n in range(killed_at, len(items)) if items[n] is None)
            server = Server(port, *args)
            restarted_at = len(counting.rows())
            wait_until(
                lambda: sum(d is not None for d in decoded(counting.rows()[restarted_at:])) > 30, 120, "resuming"
            )
            items = decoded(counting.rows())
    finally:
        server.stop()
    # once idle, nothing of the dead server's chunks runs: idle until a chunk of the restarted server
    resumed = next(n for n in range(idle_from, len(items)) if items[n] is not None)
    assert resumed >= restarted_at and all(item is None for item in items[idle_from:resumed])
    after = [item for item in items[resumed:] if item is not None]
    assert after[0][0] == 0  # the restarted server's first chunk (it numbers from 0 again) ...
    assert all(round(stamp) - OFFSET >= restarted_at for _, _, stamp in after)  # ... from a fresh observation
    assert all(items[n] is not None for n in range(resumed, len(items)))  # and it keeps up again


def test_a_server_traceback_is_logged_and_the_robot_reconnects(tmp_path, robot):
    port = free_port()
    server = Server(port, "--horizon", "20", "--action-dim", str(WIDTH), "--fail-after", "8")
    counting = CountingRobot(robot)
    try:
        with bridge(tmp_path, deploy_params(port, "switch", 20)) as child:
            wait_until(
                lambda: len({d[0] for d in decoded(counting.rows()) if d is not None} - set(range(8))) >= 3,
                120,
                "chunks after the failure",
            )
            output = child.output()
    finally:
        server.stop()
    assert "the policy server failed; its traceback:" in output
    assert "RuntimeError: test failure: this server fails request 8 (--fail-after)" in output
    assert output.count("connected to the policy server") == 2, output
    numbers = {d[0] for d in decoded(counting.rows()) if d is not None}
    assert 8 not in numbers  # the failed request's chunk never existed


def test_each_robot_has_its_own_connection_and_a_stalled_one_does_not_hold_up_the_other(tmp_path, robot):
    port = free_port()
    # the server's first connection gets every answer 3 s late (each chunk is stale when it comes, so that
    # robot idles); the robot on the other connection must run as if it were alone
    args = ("--horizon", "20", "--action-dim", str(WIDTH), "--slow-connection", "1", "--slow-connection-s", "3")
    server = Server(port, *args)
    params = deploy_params(port, "switch", 20, execution={"mode": "switch", "request_ahead_steps": 10})
    params["envs"] = ["r0", "r1"]
    robots = [CountingRobot(robot, "r0"), CountingRobot(robot, "r1")]
    moved = [lambda each=each: sum(d is not None for d in decoded(each.rows())) for each in robots]
    try:
        with bridge(tmp_path, params):
            wait_until(lambda: max(m() for m in moved) > 200, 120, "one robot moving")
            items = [decoded(each.rows()) for each in robots]
    finally:
        server.stop()
    fast, slow = sorted(items, key=lambda got: -sum(d is not None for d in got))
    assert idle_after_first_chunk(fast) == 0  # never waited on the other robot's server
    assert sum(d is not None for d in slow) < 0.5 * sum(d is not None for d in fast)  # the slow one did wait


BAD = 777.0  # every malformed answer carries it; no actuator may ever see it


def bad_answers(horizon: int) -> list:
    good = np.full((horizon, WIDTH), BAD, np.float32)
    nan = good.copy()
    nan[3, 1] = np.nan
    return [
        {"actions": good[:, :2]},  # narrower than the sinks read
        {"actions": np.full((horizon + 3, WIDTH), BAD, np.float32)},  # another horizon than announced
        {"actions": nan},
        {"action": good},  # the action key missing
        [BAD, BAD],  # not a map
        {"actions": np.full((horizon, WIDTH), BAD).astype("<U8")},  # not numbers
    ]


class ScriptedPolicyServer:
    """A policy server on a thread: answers request i with ``script[i]`` while there is one, else a good chunk."""

    def __init__(self, horizon: int, script: list) -> None:
        from websockets.sync.server import serve

        from plugrl_ros.protocol import codec

        self.codec = codec
        self.horizon = horizon
        self.script = list(script)
        self.requests = 0
        self.server = serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None)
        self.port = self.server.socket.getsockname()[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _handle(self, ws) -> None:
        ws.send(self.codec.packb({"action_horizon": self.horizon, "action_dim": WIDTH}))
        for frame in ws:
            observation = self.codec.unpackb(frame)
            stamp = float(np.asarray(observation["observation/state"]).reshape(-1)[0])
            answer = self.script.pop(0) if self.script else None
            if answer is None:
                answer = {"actions": encoded_chunk(self.requests, stamp, self.horizon, WIDTH)}
            self.requests += 1
            ws.send(self.codec.packb(answer))

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(10)


def test_malformed_answers_never_reach_an_actuator(tmp_path, robot):
    horizon = 20
    server = ScriptedPolicyServer(horizon, bad_answers(horizon))
    counting = CountingRobot(robot)
    try:
        with bridge(tmp_path, deploy_params(server.port, "switch", horizon)) as child:
            wait_until(lambda: sum(d is not None for d in decoded(counting.rows())) > 60, 120, "good chunks running")
            output = child.output()
    finally:
        server.close()
    assert server.requests > len(bad_answers(horizon))
    assert not any((row == BAD).any() for row in counting.rows())
    assert output.count("the policy server's answer was rejected, nothing of it runs") >= 1


def test_a_pause_idles_the_robot_and_nothing_planned_before_it_runs_after_it(tmp_path, robot):
    port = free_port()
    server = Server(port, "--horizon", "50", "--action-dim", str(WIDTH), "--latency", "0.03")
    counting = CountingRobot(robot)
    moving = lambda since: sum(d is not None for d in decoded(counting.rows()[since:]))  # noqa: E731
    try:
        with bridge(tmp_path, deploy_params(port, "switch", 50)):
            wait_until(lambda: moving(0) > 30, 120, "the robot moving")
            assert robot.call(SetBool, SET_PAUSED, SetBool.Request(data=True)).success
            paused_at = len(counting.rows())
            wait_until(lambda: decoded(counting.rows()[paused_at:]).count(None) >= 10, 60, "idling while paused")
            resumed_at = len(counting.rows())
            assert robot.call(SetBool, SET_PAUSED, SetBool.Request(data=False)).success
            wait_until(lambda: moving(resumed_at) > 30, 120, "moving again")
            items = decoded(counting.rows())
    finally:
        server.stop()
    first_idle = next(n for n in range(paused_at, len(items)) if items[n] is None)
    back = next(n for n in range(first_idle, len(items)) if items[n] is not None)
    assert back >= resumed_at and all(item is None for item in items[first_idle:back])
    # every chunk after the pause was computed from an observation taken after the robot had begun to idle
    # (a 50-step chunk planned before the pause would still have had steps left to replay)
    assert all(round(item[2]) - OFFSET > first_idle for item in items[back:] if item is not None)


def test_a_server_answering_the_wrong_horizon_is_refused_said_once_and_asked_again_only_with_backoff(tmp_path, robot):
    port = free_port()
    # announces nothing, answers H=8 where the robot is configured for 4: every answer is rejected
    server = Server(port, "--horizon", "8", "--action-dim", str(WIDTH), "--metadata", "{}")
    counting = CountingRobot(robot)
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    params = deploy_params(port, "switch", 4, reconnect_initial_s=0.5, reconnect_max_s=2.0)

    def rejected(msg: DiagnosticArray) -> bool:
        return has_env_entry(msg) and int(env_status(msg, 0)[2].get("answers rejected", "0")) >= 4

    try:
        with bridge(tmp_path, params) as child:
            wait_until(lambda: counting.received > 0, 60, "the bridge's first command")
            first_tick = counting.received
            _, diag = first_diag(diagnostics, rejected, 60, "four rejected answers")
            ticks = counting.received - first_tick
            level, message, values = env_status(diag, 0)
            output = child.output()
    finally:
        server.stop()
    assert not any(d is not None for d in decoded(counting.rows()))  # nothing of a rejected answer ran
    # asked again (after 0.25-0.5 s, then 0.5-1 s, ...), never once a tick (that was ~1 request per tick)
    assert ticks >= 20 * int(values["answers rejected"]), (ticks, values)
    assert level == 2 and "has a horizon of 8 steps, expected 4" in message, (level, message)
    said = [line for line in output.splitlines() if "answer was rejected" in line]
    assert len(said) == 1 and "[ERROR]" in said[0], said


def test_a_person_takes_over_from_the_policy_server_and_on_release_the_robot_idles_until_a_fresh_chunk(tmp_path, robot):
    """Deploy mode with a gamepad: while the deadman is held the person's command runs and the server's chunks
    are dropped; silent while held, the robot idles; released, no chunk computed before the release runs."""
    from sensor_msgs.msg import Joy

    person_row = [-0.5] * WIDTH
    held = [False]
    pad = robot.stream(Joy, "/joy", lambda: Joy(axes=[1.0], buttons=[0, 0, int(held[0])]), period_s=0.05)
    port = free_port()
    server = Server(port, "--horizon", "10", "--action-dim", str(WIDTH))
    params = deploy_params(port, "switch", 10)
    params["intervention"] = {
        "source": "joy",
        "max_age_s": 0.3,
        "joy": {"topic": "/joy", "axes": [0] * WIDTH, "scale": -0.5, "button": 2},
    }

    def kinds(rows: list[np.ndarray]) -> list[str]:
        return ["person" if r.tolist() == person_row else "idle" if not r.any() else "policy" for r in rows]

    def since(index: int) -> list[str]:
        return kinds(counting.rows()[index:])

    def after_first(seen: list[str], kind: str) -> set[str]:
        return set(seen[seen.index(kind) :])

    try:
        counting = CountingRobot(robot)
        with bridge(tmp_path, params):
            wait_until(lambda: since(0).count("policy") >= 30, 120, "the policy driving")
            held[0] = True
            hold = len(counting.rows())
            wait_until(lambda: since(hold).count("person") >= 20, 20, "the person driving")
            assert after_first(since(hold), "person") == {"person"}, "the server's chunk ran while the person held"

            pad.on = False  # the gamepad dies with the deadman held
            quiet = len(counting.rows())
            wait_until(lambda: since(quiet).count("idle") >= 30, 20, "idle while the device is silent")
            assert after_first(since(quiet), "idle") == {"idle"}, "a silent held device let the policy drive"

            pad.on = True
            back = len(counting.rows())
            wait_until(lambda: since(back).count("person") >= 10, 20, "the person back")
            held[0] = False
            release = len(counting.rows())
            wait_until(lambda: since(release).count("policy") >= 20, 60, "the policy driving again")
            rows = counting.rows()
    finally:
        server.stop()
    seen = kinds(rows)
    last_person = max(i for i, kind in enumerate(seen) if kind == "person")
    first_policy = seen.index("policy", last_person)
    assert "idle" in seen[last_person:first_policy], "no idle between the person and the policy"
    # a chunk's stamp is the count its observation had, and message i went out at count OFFSET + i:
    # a chunk computed before the person's last command carries a smaller stamp
    stamps = [decode_row(row)[2] for row, kind in zip(rows[first_policy:], seen[first_policy:]) if kind == "policy"]
    assert stamps and min(stamps) >= OFFSET + last_person, "a chunk computed before the release ran after it"
