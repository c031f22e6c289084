"""What every benchmark of this folder shares: timing, statistics, tables, results files and child processes.

Absolute times on a shared 2-core machine are noisy, so every benchmark
reports medians of interleaved repetitions and ratios against a baseline
measured in the same run. Results are printed as Markdown tables and, with
``--json PATH``, saved for ``bench/run_all.py`` to assemble into a report.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "test"):  # the package, and the test harness's child log
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from child_log import ChildLog  # noqa: E402

# A ROS domain of its own, so a benchmark never talks to a test or another engineer's nodes.
DEFAULT_DOMAIN_ID = "93"


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def interleaved_medians(cases: dict[str, Callable[[], Any]], repeat: int, min_time: float) -> dict[str, float]:
    """Median seconds per call of each case; one timed run of each case per round, so that a
    burst of load from a neighbour on the shared cores hits every case alike."""
    import timeit

    timers = {name: timeit.Timer(func) for name, func in cases.items()}
    numbers = {}
    for name, timer in timers.items():
        number, _ = timer.autorange()
        one = max(timer.timeit(number) / number, 1e-9)
        numbers[name] = max(1, int(min_time / one))
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, timer in timers.items():
            samples[name].append(timer.timeit(numbers[name]) / numbers[name])
    return {name: statistics.median(times) for name, times in samples.items()}


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_us(seconds: float) -> str:
    if seconds != seconds:  # nan
        return "-"
    us = seconds * 1e6
    return f"{us:,.1f}" if us < 100 else f"{us:,.0f}"


def fmt_ratio(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"


def save_json(path: str | None, name: str, data: dict[str, Any]) -> None:
    """Write one benchmark's results (``run_all.py`` reads them back)."""
    if not path:
        return
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": name, **data}, indent=1, default=float))


# -- child processes -------------------------------------------------------------


def ros_env(**extra: str) -> dict[str, str]:
    """The environment of a ROS child process: this repository importable, DDS on loopback, our domain."""
    env = dict(os.environ)
    # no empty entry: it would put the working directory on the path (where /tmp/ray, Ray's session folder,
    # shadowed the ray package in Ray's own worker processes, and ray.init waited for them forever)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), *env.get("PYTHONPATH", "").split(os.pathsep)] if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("AMENT_PREFIX_PATH", sys.prefix)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env.setdefault("ROS_DOMAIN_ID", DEFAULT_DOMAIN_ID)
    env.setdefault("ROS_HOME", tempfile.gettempdir() + "/plugrl-bench-ros-home")
    env.update(extra)
    return env


def use_own_domain() -> None:
    """For a benchmark that runs ROS nodes in its own process too: the same domain as its children."""
    env = ros_env()
    for key in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "AMENT_PREFIX_PATH", "ROS_HOME"):
        os.environ[key] = env[key]


def tune_like_the_bridge() -> None:
    """For a benchmark that runs the bridge's code in its own process: the process settings the bridge's
    ``main`` makes (allocator thresholds), where this version of the bridge makes them."""
    from plugrl_ros.node import process

    tune = getattr(process, "tune_process", None)
    if tune is not None:
        tune()


class Child:
    """A child process whose output goes to a file; stopped with SIGINT (never -9: DDS leaves shm files)."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        self.command = command
        self._log = ChildLog()
        self.proc = subprocess.Popen(
            command, env=env or ros_env(), stdout=self._log.file, stderr=subprocess.STDOUT, text=True, cwd=cwd
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self._log.text()

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(5.0)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
        return self.proc.wait()


@contextmanager
def children() -> Iterator[list[Child]]:
    """Processes started into the yielded list are stopped, newest first, when the block ends."""
    started: list[Child] = []
    try:
        yield started
    finally:
        for child in reversed(started):
            child.stop()


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def bridge_command(tree: Path | None, *args: str) -> list[str]:
    """The bridge of the package in ``tree`` (None: this checkout) as a command: an older tree (a baseline)
    has its entry point where it was then (plugrl_ros/ros/ before the node package existed)."""
    root = ROOT if tree is None else tree
    module = "node" if (root / "plugrl_ros" / "node" / "bridge_main.py").exists() else "ros"
    return python_module(f"plugrl_ros.{module}.bridge_main", *args)


def last_json_line(child: Child) -> dict[str, float]:
    """The counters a child (ros_lockstep_client.py) printed last, as one JSON line; none yet: zero steps."""
    for line in reversed(child.output().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"t": time.monotonic(), "steps": 0}


def python_script(name: str, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "bench" / name), *args]


def write_params(path: Path, params: dict[str, Any]) -> Path:
    """A ``/**: ros__parameters:`` file (JSON is YAML, so no YAML writer is needed)."""
    path.write_text(json.dumps({"/**": {"ros__parameters": params}}, indent=1))
    return path


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll_s)


class ProcessMeter:
    """CPU time, page faults and memory of one process over a measurement window."""

    def __init__(self, pid: int) -> None:
        import psutil

        self._proc = psutil.Process(pid)
        self._start: tuple[float, float, int] | None = None

    def _sample(self) -> tuple[float, float, int]:
        cpu = self._proc.cpu_times()
        return time.monotonic(), cpu.user + cpu.system, _minor_faults(self._proc.pid)

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> dict[str, float]:
        assert self._start is not None, "start() first"
        t0, cpu0, faults0 = self._start
        t1, cpu1, faults1 = self._sample()
        memory = self._proc.memory_info()
        elapsed = max(t1 - t0, 1e-9)
        return {
            "cpu_percent": 100.0 * (cpu1 - cpu0) / elapsed,
            "rss_mb": memory.rss / 2**20,
            "faults_per_s": (faults1 - faults0) / elapsed,
            "threads": float(self._proc.num_threads()),
        }


def measure_steps(
    counter: Callable[[], dict[str, float]],
    clients: Sequence[Child],
    first: int,
    seconds: float,
    warmup: float,
    what: str,
    timeout: float = 90.0,
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Running clients over a window: after their ``first`` steps and ``warmup`` seconds, the difference of
    ``counter`` (cumulative counters with ``t``) over ``seconds``, and each client's ProcessMeter figures.
    A client that exited on the way is an error."""
    wait_for(lambda: counter()["steps"] > first, timeout, f"the {what} client's first steps")
    time.sleep(warmup)
    meters = [ProcessMeter(c.pid) for c in clients]
    for meter in meters:
        meter.start()
    before = counter()
    time.sleep(seconds)
    after = counter()
    processes = [meter.stop() for meter in meters]
    for client in clients:
        if not client.alive():
            raise RuntimeError(f"the {what} client exited:\n{client.output()[-3000:]}")
    return difference(after, before), processes


def _minor_faults(pid: int) -> int:
    """Minor page faults so far (field 10 of /proc/PID/stat); 0 where there is no /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(text.rsplit(")", 1)[1].split()[7])


def standard_arguments(parser: Any, repeat: int) -> None:
    parser.add_argument("--quick", action="store_true", help="a tiny run that only checks the benchmark works")
    parser.add_argument("--json", default="", help="also save the results to this file")
    parser.add_argument("--repeat", type=int, default=repeat, help="rounds; medians are reported")


class TrainerChild(Child):
    """``bench_trainer.py`` in its own process (so it never shares the GIL with what is measured)."""

    def __init__(self, *args: str, prefix: Sequence[str] = ()) -> None:
        # prefix: e.g. ``ip netns exec NAME`` to serve inside a network namespace
        super().__init__([*prefix, *python_script("bench_trainer.py", *args)])
        self.port = 0
        wait_for(self._read_port, 20.0, "the bench trainer to listen")

    def _read_port(self) -> bool:
        if not self.alive():
            raise RuntimeError("the bench trainer exited:\n" + self.output()[-2000:])
        for line in self.output().splitlines():
            if line.startswith("PORT "):
                self.port = int(line.split()[1])
                return True
        return False

    @property
    def uri(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, float]:
        """The newest counters (cumulative)."""
        for line in reversed(self.output().splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        return {"t": time.monotonic(), "feedbacks": 0, "steps": 0}


def difference(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0) for k in after}


# -- the demo reachers driven by the scripted person -----------------------------------

# plugrl-demo-teleop as a demonstrator: drives from the first moment and all the way onto the target
DEMONSTRATOR = ("--minutes", "0", "--stray", "0", "--patience", "0", "--release", "0.01")


def record_demo_teleop(
    record: Path,
    seconds: float,
    *person: str,
    image_size: int = 64,
    seed: int | None = None,
    params: tuple[str, ...] = (),
    log: Path | None = None,
) -> int:
    """The demo reachers (2, timer mode, ``image_size`` pixels square) in teleop mode with the scripted person
    (``person``: plugrl-demo-teleop's options), recorded into ``record`` for ``seconds``, as a user runs them:
    the robot node, the scripted gamepad and a bridge with config/demo.yaml and config/demo_intervention.yaml
    (``params``: its further ``name:=value`` parameters). The bridge's exit status (stopped with Ctrl-C, which
    closes the recording whole); with ``log``, every process's output is written there."""
    from plugrl_ros import executables
    from plugrl_ros.shipped import shipped_file

    config, intervention = shipped_file("config", "demo.yaml"), shipped_file("config", "demo_intervention.yaml")
    robot = ["--envs", "2", "--mode", "timer", "--image-size", str(image_size)]
    if seed is not None:
        robot += ["--seed", str(seed)]
    bridge = executables.command(
        "plugrl_ros.node.bridge_main",
        *("--ros-args", "--params-file", str(config), "--params-file", str(intervention)),
        *("-p", "mode:=teleop", "-p", "control.mode:=timer", "-p", f"record.path:={record}"),
        *(arg for param in params for arg in ("-p", param)),
    )
    with children() as started:
        for command in (
            executables.command("plugrl_ros.demo.robot_node", *robot),
            executables.command("plugrl_ros.demo.teleop_node", *person),
            bridge,
        ):
            started.append(Child(command))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and started[-1].alive():
            time.sleep(0.5)
        code = started[-1].stop(30)  # the bridge first: it idles the reachers and closes the recording
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("".join(f"--- {' '.join(c.command[-6:])}\n{c.output()}" for c in started))
    return code
