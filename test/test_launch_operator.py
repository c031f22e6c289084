"""Opt-in, with a real ``ros2 launch``: the shipped launch files as an operator runs them, and Ctrl-C.

Skipped unless PLUGRL_ROS2_LAUNCH_ENV names a toolchain's env.sh (see launch_toolchain.py). Ctrl-C is
what a terminal sends: SIGINT to the whole process group, so every node gets it twice (the
terminal's and the one launch forwards), at whatever moment it comes.
"""

from __future__ import annotations

import json
import random
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from harness import STATE, bridge_params, float_state, wait_until, write_params
from launch_toolchain import Workspace, build_workspace
from std_msgs.msg import Float64MultiArray
from trainer_fixture import ScriptedTrainer

pytestmark = [pytest.mark.ros, pytest.mark.slow, pytest.mark.websockets]

CTRL_CS = 10


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Workspace:
    return build_workspace(tmp_path_factory.mktemp("ws"))


def read(log: Path) -> str:
    return log.read_text() if log.exists() else ""


def assert_every_process_ended_cleanly(output: str, names: list[str]) -> None:
    """launch's own account: each process "finished cleanly" (status 0), none "died", no traceback."""
    for name in names:
        assert f"[INFO] [{name}-" in output and "process has finished cleanly" in output, output[-4000:]
    cleanly = output.count("process has finished cleanly")
    assert cleanly == len(names), f"{cleanly} of {len(names)} processes finished cleanly:\n{output[-6000:]}"
    assert "process has died" not in output, output[-4000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-4000:]


# -- the demo launch ---------------------------------------------------------------------


def test_the_demo_launch_runs_with_its_inline_parameters_and_ends_with_the_run(workspace, tmp_path):
    out = tmp_path / "demo"
    done = workspace.run(
        f"ros2 launch plugrl_ros demo.launch.py duration:=8 port:=0 output:={out}", timeout=60
    )  # port 0: refused with a clear error (the bridge must know the port)
    assert done.returncode == 1 and "port:=0: expected a whole number from 1 to 65535" in done.stdout, done.stdout
    port = 20000 + random.Random().randrange(20000)
    done = workspace.run(
        f"ros2 launch plugrl_ros demo.launch.py duration:=8 envs:=2 mode:=timer rate:=20.0 port:={port} output:={out}",
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    assert_every_process_ended_cleanly(done.stdout, ["plugrl_demo_trainer", "demo_robot", "bridge"])
    assert "2 env(s): reacher0, reacher1; mode timer" in done.stdout  # the launch file's inline list and mode
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] > 0, summary


@pytest.mark.parametrize(
    ("argument", "says"),
    [
        ("envs:=two", "envs:=two: expected a whole number from 1 to 64"),
        ("rate:=fast", "rate:=fast: expected a number from 0.1 to 1000"),
        ("config:=/nonexistent/demo.yaml", "config:=/nonexistent/demo.yaml: no such params file"),
        ("mode:=fast", 'Argument "mode" provided value "fast" is not valid'),
    ],
)
def test_a_bad_demo_launch_argument_is_named_and_nothing_starts(workspace, argument, says):
    done = workspace.run(f"ros2 launch plugrl_ros demo.launch.py {argument}", timeout=60)
    assert done.returncode == 1, done.stdout
    assert says in done.stdout, done.stdout
    assert "process started" not in done.stdout, done.stdout


def test_the_demo_launch_ends_when_the_bridge_exits(workspace, tmp_path):
    config = tmp_path / "demo.yaml"
    config.write_text(
        (Path(__file__).parent.parent / "config" / "demo.yaml").read_text().replace("rate_hz:", "rate_hzz:")
    )
    port = 20000 + random.Random().randrange(20000)
    done = workspace.run(
        f"ros2 launch plugrl_ros demo.launch.py config:={config} port:={port} output:={tmp_path / 'out'}", timeout=120
    )
    assert "control.rate_hzz: " in done.stdout and "did you mean 'rate_hz'" in done.stdout, done.stdout
    # the launch ended by itself (before: it waited for ever), stopping the robot and the trainer in order
    assert "process has died [pid" in done.stdout and "exit code 2" in done.stdout, done.stdout
    assert "sending signal 'SIGINT' to process[demo_robot" in done.stdout, done.stdout
    assert done.stdout.count("process has finished cleanly") == 2, done.stdout
    assert (tmp_path / "out" / "summary.json").is_file(), done.stdout  # the trainer still wrote its results


def test_ctrl_c_ends_the_demo_launch_with_every_process_clean_and_the_results_written(workspace, tmp_path):
    out = tmp_path / "demo"
    port = 20000 + random.Random().randrange(20000)
    log = tmp_path / "launch.log"
    command = f"ros2 launch plugrl_ros demo.launch.py duration:=600 port:={port} output:={out}"
    with workspace.launched(command, log) as launch:
        wait_until(lambda: "episodes" in read(log) and "client(s)" in read(log), 120, "the demo training")
        # the with block's end is the Ctrl-C
    assert launch.returncode == 0, read(log)[-4000:]
    output = read(log)
    assert_every_process_ended_cleanly(output, ["plugrl_demo_trainer", "demo_robot", "bridge"])
    # the bridge stopped on its own Ctrl-C, or on the trainer's stop that the trainer's Ctrl-C sent first
    assert "interrupted: idling the actuators" in output or "the trainer finished the run" in output, output
    assert json.loads((out / "summary.json").read_text())["episodes"] >= 0


# -- Ctrl-C of the bridge launch, at varied moments -----------------------------------------


def _moments() -> list[tuple[str, float]]:
    """Where in the bridge's life each Ctrl-C comes: named stages, and seeded random delays after the start."""
    rng = random.Random(10)
    # "starting": once the bridge handles SIGTERM itself (its stop handlers are in place), while it imports
    # rclpy and creates its node. Before that, Python itself starts and the console-script wrapper that
    # colcon or pip generated looks the entry point up (up to half a second on a loaded machine): no code
    # of the package runs yet, and a Ctrl-C then ends the process as it ends any Python program.
    staged = [("starting", 0.0), ("starting", 0.5), ("connected", 0.0), ("mid-chunk", 0.0), ("mid-chunk", 1.5)]
    return staged + [("random", round(rng.uniform(0.3, 8.0), 2)) for _ in range(CTRL_CS - len(staged))]


def handles_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler of its own for SIGTERM (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True  # already gone: nothing left to wait for
    caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M)[1], 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize(("stage", "delay"), _moments())
def test_ctrl_c_under_ros2_launch_ends_the_bridge_cleanly_at_any_moment(workspace, robot, tmp_path, stage, delay):
    robot.stream(Float64MultiArray, "/state", float_state(0.0))
    cmd = robot.listen(Float64MultiArray, "/cmd")

    def long_chunk(env_indices, step_ids, observation):
        return np.full((500, len(env_indices), 1), 0.5, dtype="<f4")  # ten seconds of motion

    actions = {"cmd": {"topic": "cmd", "type": "std_msgs/Float64MultiArray", "slice": [0, 1], "idle": "zero"}}
    config = write_params(
        tmp_path / "bridge.yaml", bridge_params("ws://127.0.0.1:9", observations=STATE, actions=actions)
    )
    log = tmp_path / "launch.log"
    with ScriptedTrainer({"action_horizon": 500, "action_dim": 1}, long_chunk) as trainer:
        # server_uri:= is an inline parameter of the launch file, over the params file's trainer.uri
        command = f"ros2 launch plugrl_ros bridge.launch.py config:={config} server_uri:={trainer.uri}"
        with workspace.launched(command, log) as launch:
            pid = int(wait_until(lambda: re.search(r"process started with pid \[(\d+)\]", read(log)), 120, "launch")[1])
            wait_until(lambda: handles_sigterm(pid), 120, "the bridge's stop handlers")
            started = time.monotonic()
            if stage == "connected":
                wait_until(lambda: "connected to the trainer at" in read(log), 120, "the bridge's connection")
            elif stage == "mid-chunk":
                wait_until(lambda: sum(m.data[0] == 0.5 for m in cmd.msgs()) >= 5, 120, "a chunk running")
            wait_until(lambda: time.monotonic() >= started + delay, delay + 5, f"{delay} s")
            t_signal = time.monotonic()
            # the with block's end is the Ctrl-C
        output = read(log)
        closes = [trainer.wait_closed(c, 10) for c in range(trainer.connections)]
    assert launch.returncode == 0, output[-4000:]
    assert_every_process_ended_cleanly(output, ["bridge"])
    opened = output.count("connected to the trainer at")
    # every connection the bridge had opened was closed with 1000 (a handshake cut short never opened)
    assert [code for code, _ in closes[:opened]] == [1000] * opened, (closes, output[-4000:])
    if stage in ("connected", "mid-chunk"):
        assert opened >= 1, output[-4000:]
    if cmd.msgs(t_signal):
        # after the Ctrl-C, the bridge's last word to its actuator is idle (zero), never a step of a chunk
        wait_until(lambda: cmd.msgs()[-1].data[0] == 0.0, 10, "a zero command at the end")
