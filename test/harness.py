"""Helpers for tests that run real processes: the test trainer in a thread, ROS processes, timeouts."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
from child_log import ChildLog
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.context import Context
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions
from std_msgs.msg import Float64MultiArray
from trainer_fixture import Record

from plugrl_ros import executables
from plugrl_ros.protocol import codec
from plugrl_ros.ros.qos import qos_profile
from plugrl_ros.tools import serving
from plugrl_ros.tools.test_trainer import Report, TestTrainer, TrainerSettings

ROOT = Path(__file__).resolve().parent.parent


class TrainerThread(serving.TrainerThread[Report]):
    """The protocol-checking test trainer, serving on its own event loop thread."""

    def __init__(self, settings: TrainerSettings) -> None:
        super().__init__(TestTrainer(settings), name="plugrl-test-trainer")
        self.settings = settings

    def report(self, timeout: float) -> Report:
        return self.result(timeout)


def ros_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: the installed package, as a user has it (never the checkout's path)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def python_module(module: str, *args: str) -> list[str]:
    """``python -m module`` as the package starts its own children: the installed package, not the cwd's."""
    return executables.command(module, *args)


class Child:
    """A child process whose output goes to a file (a full pipe would block it)."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None, session: bool = False) -> None:
        """``session``: in a process group of its own, for a terminal's Ctrl-C (SIGINT to the group); it is
        stopped as a group too, so a child it started (``ros2 run`` forwards no signal) does not outlive it."""
        self._log = ChildLog()
        self._session = session
        self.proc = subprocess.Popen(
            command,
            env=env or ros_env(),
            stdout=self._log.file,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=session,
        )

    def wait(self, timeout: float) -> int:
        """Its exit code; AssertionError after ``timeout`` with where it hangs (py-spy, if installed) and its output."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running after {timeout:g} s: {self.proc.args[-4:]}\n{self.stacks()}\n"
                f"--- output ---\n{self.output()}"
            ) from None

    def stacks(self) -> str:
        """Where its Python threads are now (py-spy, if installed), or how it ended."""
        if self.proc.poll() is not None:
            return f"(exited with {self.proc.returncode})"
        if not shutil.which("py-spy"):
            return "(py-spy not installed: no stacks)"
        command = ["py-spy", "dump", "--pid", str(self.proc.pid)]
        dump = subprocess.run(command, check=False, capture_output=True, text=True)
        return dump.stdout + dump.stderr

    def stop(self, timeout: float = 15.0) -> int:
        if not self._session:
            return stop(self.proc, timeout)
        code = self.proc.poll()
        for signum in (signal.SIGINT, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, signum)  # the group outlives its leader: stop what it started
            except ProcessLookupError:
                break
            try:
                code = self.proc.wait(timeout)
                # give the rest of the group the same time to end on the SIGINT
                deadline = time.monotonic() + timeout
                while _group_alive(self.proc.pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if not _group_alive(self.proc.pid):
                    break
            except subprocess.TimeoutExpired:
                continue
        return self.proc.wait() if code is None else code

    def output(self) -> str:
        return self._log.text()


@contextmanager
def process(command: list[str], env: dict[str, str] | None = None, session: bool = False) -> Iterator[Child]:
    """A child process that is stopped with SIGINT (never -9: DDS leaves shm files) when the block ends."""
    child = Child(command, env, session)
    try:
        yield child
    finally:
        child.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def launch_arguments(launch_file: Path) -> set[str]:
    """The names a launch file declares with ``DeclareLaunchArgument`` (read, not run: no launch_ros here)."""
    import ast

    return {
        node.args[0].value
        for node in ast.walk(ast.parse(launch_file.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", "") == "DeclareLaunchArgument"
        and isinstance(node.args[0], ast.Constant)
    }


def launch_params_file(path: Path, node_name: str, params: dict) -> Path:
    """The params file launch_ros writes for ``Node(name=..., parameters=[params])``, at ``path``.

    As launch_ros.actions.Node does it: nested dicts flattened to dotted names
    and lists made tuples (normalize_parameters), then
    ``yaml.dump({node: {"ros__parameters": ...}}, default_flow_style=False)``,
    so every list comes out as a ``!!python/tuple`` block.
    """
    import yaml

    def flat(tree: dict, prefix: str = "") -> dict:
        out: dict = {}
        for name, value in tree.items():
            key = f"{prefix}.{name}" if prefix else name
            if isinstance(value, dict):
                out.update(flat(value, key))
            else:
                out[key] = tuple(value) if isinstance(value, list) else value
        return out

    with open(path, "w") as stream:
        yaml.dump({node_name: {"ros__parameters": flat(params)}}, stream, default_flow_style=False)
    return path


@contextmanager
def rcl_node(*ros_args: str):
    """A node named plugrl_bridge given ``ros_args`` as ``ros2 run`` passes them, in a context of its own.

    Yields ``(node, argv)``: rcl has parsed the arguments into the node's overrides.
    """
    import rclpy
    from rclpy.context import Context
    from rclpy.node import Node
    from rclpy.signals import SignalHandlerOptions

    argv = ["bridge", "--ros-args", *ros_args]
    context = Context()
    rclpy.init(args=argv, context=context, signal_handler_options=SignalHandlerOptions.NO)
    try:
        node = Node("plugrl_bridge", context=context, enable_rosout=False, start_parameter_services=False)
        try:
            yield node, argv
        finally:
            node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)


# -- a bridge as a real process, a fake robot over real DDS, what the trainer saw --------------


RATE_HZ = 50.0
PERIOD_S = 1.0 / RATE_HZ
BRIDGE = python_module("plugrl_ros.node.bridge_main")
DIAG_PREFIX = "plugrl_bridge"
SET_PAUSED = "/plugrl_bridge/set_paused"
# A stop (Ctrl-C, SIGTERM) takes about 2 s at most: idle, then close the link. This bound is a hang
# guard that a loaded 2-core machine cannot break; the stop's order is what the tests check.
STOP_BOUND_S = 8.0


def about_one_period(interval_s: float) -> bool:
    """A message interval is one control period, not two or half of one (wide: load delays ticks)."""
    return 0.5 * PERIOD_S <= interval_s <= 1.9 * PERIOD_S


# -- waiting -------------------------------------------------------------------------


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it is truthy and return its value; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.01)


# -- params files --------------------------------------------------------------------


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return ""  # a key with no value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a double-quoted YAML string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    raise TypeError(f"no YAML form for {value!r}")


def _yaml_lines(values: dict, indent: int) -> list[str]:
    lines = []
    for key, value in values.items():
        if isinstance(value, dict):
            lines.append(" " * indent + f"{key}:")
            lines += _yaml_lines(value, indent + 2)
        else:
            lines.append(" " * indent + f"{key}: {_yaml_scalar(value)}")
    return lines


def write_params(path: Path, params: dict) -> Path:
    """A ``/**: ros__parameters:`` params file holding ``params`` (nested dicts)."""
    path.write_text("\n".join(["/**:", "  ros__parameters:", *_yaml_lines(params, 4)]) + "\n")
    return path


def merged(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def bridge_params(uri: str, **sections: Any) -> dict:
    """A fast-running bridge (50 Hz, quick reconnects and diagnostics) with ``sections`` merged in."""
    base = {
        "trainer": {"uri": uri, "reconnect_initial_s": 0.05, "reconnect_max_s": 0.2},
        "control": {"rate_hz": RATE_HZ},
        "status": {"diagnostics_period_s": 0.2, "log_period_s": 0.0},
    }
    return merged(base, sections)


STATE = {"states": {"pos": {"topic": "state", "type": "std_msgs/Float64MultiArray"}}}


@contextmanager
def bridge(tmp_path: Path, params: dict, *ros_args: str) -> Iterator[Child]:
    """The bridge node as a child process, stopped with SIGINT when the block ends.

    Its output is printed then; pytest shows it when the test fails.
    """
    path = write_params(tmp_path / "bridge.yaml", params)
    with process([*BRIDGE, "--ros-args", "--params-file", str(path), *ros_args]) as child:
        try:
            yield child
        finally:
            child.stop()
            print(f"--- bridge output ---\n{child.output()}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the fake robot ------------------------------------------------------------------


class Inbox:
    """Messages received on one topic, with their arrival times (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[float, Any]] = []

    def add(self, msg: Any) -> None:
        with self._lock:
            self._items.append((time.monotonic(), msg))

    def timed(self, since: float = -math.inf) -> list[tuple[float, Any]]:
        with self._lock:
            return [(t, m) for t, m in self._items if t >= since]

    def msgs(self, since: float = -math.inf) -> list[Any]:
        return [m for _, m in self.timed(since)]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class Stream:
    """A topic the robot publishes periodically; ``make`` may be swapped and ``on`` cleared at any time."""

    def __init__(self, publisher: Any, make: Callable[[], Any]) -> None:
        self.publisher = publisher
        self.make = make
        self.on = True
        self.count = 0

    def tick(self) -> None:
        if self.on:
            self.publisher.publish(self.make())
            self.count += 1


class Robot:
    """A fake robot: an rclpy node with its own Context, spun by a SingleThreadedExecutor on a thread."""

    def __init__(self) -> None:
        self.context = Context()
        rclpy.init(context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node("fake_robot", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._clients: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._spin, name="fake-robot", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except ExternalShutdownException:
            pass

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=5)
        self._thread.join(5)
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)

    def publisher(self, msg_type: type, topic: str) -> Any:
        return self.node.create_publisher(msg_type, topic, qos_profile("reliable", 10))

    def stream(self, msg_type: type, topic: str, make: Callable[[], Any], period_s: float = PERIOD_S) -> Stream:
        stream = Stream(self.publisher(msg_type, topic), make)
        self.node.create_timer(period_s, stream.tick)
        return stream

    def listen(self, msg_type: type, topic: str, then: Callable[[Any], None] | None = None) -> Inbox:
        inbox = Inbox()

        def callback(msg: Any) -> None:
            inbox.add(msg)
            if then is not None:
                then(msg)

        self.node.create_subscription(msg_type, topic, callback, qos_profile("reliable", 100))
        return inbox

    def call(self, srv_type: type, name: str, request: Any, timeout: float = 30.0) -> Any:
        """Call a service (its client is kept, so a second call needs no discovery) and wait for the answer."""
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = self.node.create_client(srv_type, name)
        assert client.wait_for_service(timeout_sec=timeout), f"service {name} did not appear"
        future = client.call_async(request)
        wait_until(future.done, timeout, f"the answer of {name}")
        return future.result()

    def discover(self, srv_type: type, name: str, timeout: float = 30.0) -> None:
        """Create the client of ``name`` now and wait until the service is there, so a later call is quick."""
        client = self._clients[name] = self.node.create_client(srv_type, name)
        assert client.wait_for_service(timeout_sec=timeout), f"service {name} did not appear"


def float_state(value: float) -> Callable[[], Float64MultiArray]:
    return lambda: Float64MultiArray(data=[value])


# -- reading what the trainer and /diagnostics saw ---------------------------------


def of_kind(records: list[Record], kind: str, connection: int | None = None) -> list[dict]:
    return [m for c, m in records if m["message_type"] == kind and (connection is None or c == connection)]


def env_rows(message: dict) -> dict[int, int]:
    """env index -> row of ``message`` (an infer or feedback)."""
    return {int(e): row for row, e in enumerate(message["env_indices"])}


def obs_of(message: dict) -> dict:
    return message["data"] if message["message_type"] == "infer" else message["data"]["obs"]


def state_of(message: dict, env: int, name: str = "pos") -> np.ndarray:
    return obs_of(message)["states"][name][env_rows(message)[env]]


def with_env(records: list[tuple[float, int, dict]], kind: str, env: int) -> list[tuple[float, dict]]:
    return [(t, m) for t, _, m in records if m["message_type"] == kind and env in env_rows(m)]


def statuses(msg: DiagnosticArray) -> dict[str, tuple[int, str, dict[str, str]]]:
    """name -> (level, message, values) of one /diagnostics message."""
    out = {}
    for status in msg.status:
        level = status.level[0] if isinstance(status.level, bytes) else int(status.level)
        out[status.name] = (level, status.message, {kv.key: kv.value for kv in status.values})
    return out


def env_status(msg: DiagnosticArray, index: int) -> tuple[int, str, dict[str, str]]:
    for name, status in statuses(msg).items():
        if name.startswith(f"{DIAG_PREFIX}: env {index} "):
            return status
    raise AssertionError(f"no diagnostics entry for env {index}: {list(statuses(msg))}")


def first_diag(
    inbox: Inbox, predicate: Callable[[DiagnosticArray], bool], timeout: float, what: str, since: float = -math.inf
) -> tuple[float, DiagnosticArray]:
    """The arrival time and content of the first /diagnostics message after ``since`` satisfying ``predicate``.

    On a timeout the error shows what the last message said (or that none came), the only clue to why.
    """
    try:
        return wait_until(lambda: next(((t, m) for t, m in inbox.timed(since) if predicate(m)), None), timeout, what)
    except AssertionError as exc:
        received = inbox.msgs(since)
        last = statuses(received[-1]) if received else {}
        said = {name: status[:2] for name, status in last.items()} if received else "none received"
        troubled = {name: status[2] for name, status in last.items() if status[0] != 0}
        details = f"; what its troubled entries hold: {troubled}" if troubled else ""
        raise AssertionError(f"{exc}; {len(received)} /diagnostics messages, the last: {said}{details}") from None


OK, WARN = 0, 1


# -- a. startup validation -------------------------------------------------------------

VALID = {
    "observations": {
        "states": {"joints": {"topic": "joint_states", "type": "sensor_msgs/JointState", "joints": ["j1", "j2"]}}
    },
    "actions": {"arm": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 2]}},
}


def reset_retry_delays(output: str, target: str) -> list[float]:
    """The delays the bridge chose after each failed call of ``target``'s reset service, from its log.

    The bridge's own words, not wall-clock gaps: what the backoff decided is exact
    on any machine. A "not available" report is no call (the service was not there).
    """
    return [
        float(re.search(r"retrying in ([0-9.]+) s", line).group(1))
        for line in output.splitlines()
        if f"reset of {target} failed" in line and "retrying in" in line and "is not available" not in line
    ]


def per_env_chunk(horizon: int) -> Callable:
    """Step k of env e is worth 100 * (e + 1) + k: a command tells which env and which step it was."""

    def actions(env_indices, step_ids, observation):
        chunk = np.zeros((horizon, len(env_indices), 1), dtype="<f4")
        for row, env in enumerate(env_indices):
            chunk[:, row, 0] = 100 * (int(env) + 1) + np.arange(horizon)
        return chunk

    return actions


def record_demo_teleop(
    record: Path, seconds: float, image_size: int, *person: str, params: tuple[str, ...] = ()
) -> tuple[int, str]:
    """The demo reachers (timer mode) in teleop mode with the scripted person (``person``: plugrl-demo-teleop's
    options), recorded into ``record`` for ``seconds`` by the benchmarks' own helper (bench/common.py); the
    bridge's exit status (Ctrl-C) and every process's output. ``params``: the bridge's further parameters."""
    sys.path.insert(0, str(ROOT / "bench"))
    from common import record_demo_teleop as recorded

    log = record.with_name(record.name + ".log")
    code = recorded(record, seconds, *person, image_size=image_size, params=params, log=log)
    return code, log.read_text()


def serving_policy(command: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """``plugrl-policy-server`` started by ``command``, once it says where it listens: the process and its URI."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        found = re.search(r"listening on (wss?://\S+)", line)
        if found:
            return proc, found.group(1).replace("127.0.0.1", "localhost")
    raise AssertionError("the server did not start:\n" + "".join(seen))


async def ask_policy_server(uri: str, request: dict, headers: dict | None = None) -> tuple[dict, dict]:
    """One request to an openpi-compatible policy server: its metadata and its answer."""
    from websockets.asyncio.client import connect

    async with connect(uri, max_size=None, additional_headers=headers) as ws:
        metadata = codec.unpackb(await asyncio.wait_for(ws.recv(), 60.0))
        await ws.send(codec.packb(request))
        return metadata, codec.unpackb(await asyncio.wait_for(ws.recv(), 60.0))
