"""Tests of the demo: the reacher, the demo trainer's exchange and learning, the runner's pieces, the whole demo."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from harness import ROOT, launch_arguments, stop
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from plugrl_ros import executables
from plugrl_ros.demo.diagnostics import parse_deploy_diagnostics, parse_diagnostics
from plugrl_ros.demo.reacher import Reacher, ReacherSpec, fingertip
from plugrl_ros.demo.results import EpisodeRecord, moving_average, summarize, write_results
from plugrl_ros.demo.trainer import DemoTrainer, DemoTrainerSettings, PolicyGradient, Session
from plugrl_ros.protocol.client import RESYNC_REASON, ClientSettings
from plugrl_ros.protocol.codec import packb, unpackb
from plugrl_ros.protocol.errors import ProtocolError
from plugrl_ros.protocol.messages import ObservationRow, build_feedback, build_infer, episode_info
from plugrl_ros.record.read import read_all
from plugrl_ros.tools.headless_probe import HeadlessProbe, HeadlessSettings
from plugrl_ros.tools.serving import TrainerThread

SPEC = ReacherSpec()


def arm(seed: int = 0) -> Reacher:
    return Reacher(SPEC, np.random.default_rng(seed))


# -- the reacher ---------------------------------------------------------------------


def test_fingertip_is_the_forward_kinematics_of_both_links():
    assert np.allclose(fingertip(SPEC, np.array([0.0, 0.0])), [0.2, 0.0])
    assert np.allclose(fingertip(SPEC, np.array([np.pi / 2, 0.0])), [0.0, 0.2])
    assert np.allclose(fingertip(SPEC, np.array([0.0, np.pi / 2])), [0.1, 0.1])


def test_joints_track_the_commanded_velocity_within_speed_and_joint_limits():
    a = arm()
    a.q = np.array([0.0, 0.0])
    for _ in range(40):
        a.step(np.array([1.0, -10.0]))  # the elbow command is beyond max_speed
    assert a.qd[0] == pytest.approx(1.0, abs=1e-3)
    assert a.q[0] == pytest.approx(1.0 * 40 * SPEC.dt, abs=0.15)  # the motor lag costs a little
    for _ in range(200):
        a.step(np.array([2.0, -2.0]))
    assert a.q[0] == pytest.approx(SPEC.joint_limit) and a.q[1] == pytest.approx(-SPEC.joint_limit)
    assert np.all(a.qd == 0.0)  # stopped at the limits


def test_reward_is_minus_the_distance_to_the_target_minus_the_action_cost():
    a = arm()
    command = np.array([0.5, -1.0])
    reward, _ = a.step(command)
    assert reward == pytest.approx(-a.distance() - SPEC.action_cost * float(command @ command))


def test_episode_terminates_after_the_fingertip_holds_on_the_target():
    a = arm()
    a.q = a.target_q.copy()
    results = [a.step(np.zeros(2))[1] for _ in range(SPEC.hold_steps)]
    assert results == [False] * (SPEC.hold_steps - 1) + [True]
    a.reset()
    assert a.distance() >= SPEC.min_target_distance
    assert a.step(np.zeros(2))[1] is False


def test_reset_is_seeded_and_starts_at_rest_away_from_the_target():
    one, two, other = arm(5), arm(5), arm(6)
    for _ in range(20):
        assert np.array_equal(one.q, two.q) and np.array_equal(one.target_q, two.target_q)
        assert np.all(one.qd == 0.0) and one.steps == 0
        assert one.distance() >= SPEC.min_target_distance
        assert np.all(np.abs(one.q) <= SPEC.joint_limit - SPEC.start_margin)
        one.reset()
        two.reset()
    assert not np.array_equal(arm(5).q, other.q)


def test_target_state_points_from_the_fingertip_and_the_joints_to_the_target():
    a = arm(3)
    state = a.target_state()
    assert np.allclose(fingertip(SPEC, a.q) + state[:2], a.target)
    assert np.allclose(fingertip(SPEC, a.q + state[2:]), a.target)


def test_render_draws_the_arm_and_the_target_where_they_are():
    a = arm(1)
    image = a.render(64)
    assert image.shape == (64, 64, 3) and image.dtype == np.uint8
    scale = (64 / 2 - 2) / (SPEC.reach * 1.1)
    col, row = (round(32 + a.target[0] * scale), round(32 - a.target[1] * scale))
    assert tuple(image[row, col]) == (230, 60, 50)  # the target's red at the target
    before = image.copy()
    a.q = a.q + 0.5
    assert not np.array_equal(a.render(64), before)  # the arm moved in the picture
    assert a.render(96).shape == (96, 96, 3)


# -- the trainer's exchange ----------------------------------------------------------------


def observation(states: list[np.ndarray]) -> dict:
    joints = np.array([s[:4] for s in states], dtype="<f8").reshape(len(states), 4)
    target = np.array([s[4:] for s in states], dtype="<f8").reshape(len(states), 4)
    images = np.zeros((len(states), 8, 8, 3), dtype=np.uint8)
    return {"images": {"camera": images}, "states": {"joints": joints, "target": target}, "text": [""] * len(states)}


class Opened:
    """A session whose metadata went out; takes messages as maps, packs them as the client would."""

    def __init__(self, horizon: int) -> None:
        self.session = Session(PolicyGradient(DemoTrainerSettings(horizon=horizon, seed=1)), horizon)
        self.session.metadata()

    def receive(self, message: dict):
        return self.session.receive(packb(message))


def session(horizon: int = 5) -> Opened:
    return Opened(horizon)


def test_infer_gets_a_time_major_chunk_for_its_envs():
    s = session(horizon=5)
    states = [np.arange(8.0), np.arange(8.0) + 1]
    frame, _ = s.receive(build_infer([3, 1], [0, 0], observation(states)))
    action = unpackb(frame)
    assert action["message_type"] == "action"
    assert action["data"]["env_ids"].tolist() == [3, 1]
    chunk = action["data"]["action"]
    assert chunk.shape == (5, 2, 2) and chunk.dtype.str == "<f4"
    # one command per env, repeated over the chunk's steps
    assert np.array_equal(chunk[0], chunk[4]) and not np.array_equal(chunk[0, 0], chunk[0, 1])


def feedback(envs, states, rewards, terminated, info=None) -> dict:
    m = len(envs)
    return build_feedback(
        envs, [1] * m, observation(states), rewards, terminated, [False] * m, info if info is not None else {}
    )


def test_reuse_takes_the_last_feedback_observation_and_is_refused_after_a_terminal_one():
    s = session()
    state = np.arange(8.0)
    s.receive(build_infer([0, 1], [0, 0], observation([state, state])))
    ended = episode_info([False, True], [0.0, -3.0], [0, 5], [False, False])
    _, finished = s.receive(feedback([0, 1], [state, state], [-1.0, -3.0], [False, True], ended))
    assert finished == [(1, -3.0, 5)]
    frame, _ = s.receive(build_infer([0], [1], observation([]), reuse=[True]))
    assert unpackb(frame)["data"]["action"].shape == (5, 1, 2)
    s.receive(feedback([0], [state], [-1.0], [False]))
    with pytest.raises(ProtocolError, match="reuse"):
        s.receive(build_infer([1], [0], observation([]), reuse=[True]))


def test_exchange_out_of_order_is_a_protocol_error():
    s = session()
    with pytest.raises(ProtocolError, match="began with a feedback"):
        s.receive(feedback([0], [np.zeros(8)], [0.0], [False]))
    s = session()
    s.receive(build_infer([0], [0], observation([np.zeros(8)])))
    s.receive(feedback([0], [np.zeros(8)], [0.0], [False]))
    s.receive(build_infer([0], [1], observation([np.zeros(8)])))
    with pytest.raises(ProtocolError, match="holds no action"):
        s.receive(feedback([1], [np.zeros(8)], [0.0], [False]))


@pytest.mark.websockets
def test_the_demo_trainer_resyncs_on_an_info_it_cannot_split_per_env():
    """The protocol's §5.4 (docs/protocol.md), as a server checklist checks it: {"task": "pick"} for 2 envs: resync."""
    trainer = TrainerThread(DemoTrainer(DemoTrainerSettings(port=0, duration_s=300.0)))
    port = trainer.start()
    state = np.zeros(8)

    async def feed_back(info: dict) -> object:
        """One cycle for envs 0 and 1 with ``info``; what answers the next infer (an action, or the close)."""
        async with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
            assert unpackb(await ws.recv())["message_type"] == "metadata"
            await ws.send(packb(build_infer([0, 1], [0, 0], observation([state, state]))))
            assert unpackb(await ws.recv())["message_type"] == "action"
            await ws.send(packb(feedback([0, 1], [state, state], [0.0, 0.0], [False, False], info)))
            await ws.send(packb(build_infer([0, 1], [1, 1], observation([state, state]))))
            try:
                return unpackb(await asyncio.wait_for(ws.recv(), 30.0))["message_type"]
            except ConnectionClosed as closed:
                return (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else None

    try:
        assert asyncio.run(feed_back({"task": "pick"})) == (1001, RESYNC_REASON)
        # the server goes on: a new connection whose info splits per env is served
        assert asyncio.run(feed_back({"task": "pick", "success": np.array([False, True])})) == "action"
        ended = episode_info([False, True], [0.0, -3.0], [0, 5], [False, False])
        assert asyncio.run(feed_back({**ended, "task": "pick"})) == "action"
    finally:
        trainer.end()
        assert trainer.join(10.0)


# -- the trainer learns, over the real websocket protocol ----------------------------------


class ReacherEnvs:
    """Reachers behind the headless client stack (as the probe envs are), with the demo robot's observation."""

    def __init__(self, n: int, action_dim: int) -> None:
        assert action_dim == 2
        self.n = n
        self.action_dim = action_dim
        self.arms = [Reacher(SPEC, np.random.default_rng([0, i])) for i in range(n)]

    def step(self, env: int, action: np.ndarray) -> tuple[float, bool]:
        # the bridge clips to config/demo.yaml's limits before the robot sees the command
        return self.arms[env].step(np.clip(action, -2.0, 2.0))

    def reset(self, env: int) -> None:
        self.arms[env].reset()

    def row(self, env: int) -> ObservationRow:
        a = self.arms[env]
        return ObservationRow(
            images={"camera": a.render(32)},
            states={"joints": np.concatenate([a.q, a.qd]), "target": a.target_state()},
        )


@pytest.mark.websockets
def test_trainer_improves_the_mean_episode_return():
    trainer = TrainerThread(DemoTrainer(DemoTrainerSettings(port=0, duration_s=300.0, seed=0)))
    port = trainer.start()
    probe = HeadlessProbe(
        HeadlessSettings(
            client=ClientSettings(uri=f"ws://127.0.0.1:{port}"), n_envs=2, steps=2500, max_episode_steps=60
        ),
        make_envs=ReacherEnvs,
    )
    try:
        # a watchdog, not a timing claim: 2500 feedbacks take about 30 s on a loaded 2-core machine
        assert asyncio.run(asyncio.wait_for(probe.run(), 300.0)) == 0
    finally:
        trainer.end()
        assert trainer.join(10.0)
    returns = np.array([r.ret for r in trainer.trainer.records()])
    assert len(returns) > 300
    tenth = len(returns) // 10
    first, last = returns[:tenth].mean(), returns[-tenth:].mean()
    # a zero policy scores about -12.5 here, a hand-tuned one about -3.6
    assert first < -9.0
    assert last > first + 3.0, (first, last)
    assert trainer.trainer.stats().updates > 10


# -- the runner's pieces ------------------------------------------------------------------


def without(statuses: dict, name: str) -> dict:
    return {k: v for k, v in statuses.items() if k != name}


def test_parse_diagnostics_reads_the_bridge_link_and_sums_the_envs():
    trainer = {"connected": "True", "infer round trip median ms": "3.5", "reconnects": "2"}
    statuses = {
        "plugrl_bridge: trainer": ("ok", trainer),
        "plugrl_bridge: control": ("ok", {"mode": "lockstep"}),
        "plugrl_bridge: env 0 (reacher0)": ("running", {"steps": "100", "episodes": "2"}),
        "plugrl_bridge: env 1 (reacher1)": ("running", {"steps": "50", "episodes": "1"}),
    }
    status = parse_diagnostics(statuses, 1.0)
    assert status is not None
    assert (status.connected, status.infer_ms, status.reconnects) == (True, 3.5, 2)
    assert (status.steps, status.episodes) == (150, 3)
    trainer["infer round trip median ms"] = "-"
    assert parse_diagnostics(statuses, 1.0).infer_ms is None
    assert parse_diagnostics(without(statuses, "plugrl_bridge: trainer"), 1.0) is None  # another node's


def env_values(episodes: str, mean: str, successes: str, steps: str, idle: str, latency: str) -> dict:
    """A deploy-mode env entry's values, as the bridge names them."""
    names = ("episodes", "mean return", "successes", "steps", "idle steps at boundaries", "request latency median ms")
    return dict(zip(names, (episodes, mean, successes, steps, idle, latency), strict=True))


def test_parse_deploy_diagnostics_weights_each_robots_mean_return_by_its_episodes():
    statuses = {
        "plugrl_bridge: policy server": ("ok", {"connected robots": "1/2"}),
        "plugrl_bridge: control": ("ok", {"mode": "timer (deploy)"}),
        "plugrl_bridge: env 0 (reacher0)": (
            "running",
            env_values(episodes="3", mean="-2.000", successes="2", steps="100", idle="1", latency="4.5"),
        ),
        "plugrl_bridge: env 1 (reacher1)": (
            "running",
            env_values(episodes="1", mean="-6.000", successes="0", steps="40", idle="0", latency="-"),
        ),
    }
    status = parse_deploy_diagnostics(statuses, 1.0)
    assert status is not None
    assert (status.connected, status.robots, status.episodes, status.successes) == (1, 2, 4, 2)
    assert status.mean_return == pytest.approx(-3.0)  # (3 * -2 + 1 * -6) / 4
    assert (status.steps, status.idle_steps, status.latency_ms) == (140, 1, 4.5)
    assert parse_deploy_diagnostics(without(statuses, "plugrl_bridge: policy server"), 1.0) is None  # not deploy
    assert parse_diagnostics(statuses, 1.0) is None  # nor is it a training bridge


def test_summary_compares_the_first_and_last_episodes():
    records = [EpisodeRecord(float(i), 0, float(i), 10) for i in range(100)]
    summary = summarize(records, 60.0)
    assert summary["episodes"] == 100
    assert summary["first_mean_return"] == pytest.approx(np.mean(range(summary["compared_episodes"])))
    assert summary["last_mean_return"] > summary["first_mean_return"]
    assert summarize([], 1.0)["episodes"] == 0
    assert moving_average([1, 2, 3, 4], 2).tolist() == [1.5, 2.5, 3.5]
    assert len(moving_average([1.0], 5)) == 0


def test_the_results_have_a_plot_with_matplotlib_and_are_complete_without_it(tmp_path, monkeypatch):
    records = [EpisodeRecord(float(i), i % 2, -10.0 + i / 10, 20) for i in range(60)]
    summary = summarize(records, 60.0)
    drawn = write_results(tmp_path / "with", records, summary)
    assert Path(drawn["returns.png"]).stat().st_size > 10_000
    # as on a robot whose rosdep install brought no matplotlib: importing it fails
    for name in {"matplotlib", *(m for m in sys.modules if m.startswith("matplotlib."))}:
        monkeypatch.setitem(sys.modules, name, None)
    paths = write_results(tmp_path / "without", records, summary)
    assert set(paths) == {"summary.json", "episodes.csv"}
    assert not (tmp_path / "without" / "returns.png").exists()
    assert json.loads(Path(paths["summary.json"]).read_text())["files"] == paths
    assert len(Path(paths["episodes.csv"]).read_text().splitlines()) == 61


# -- the whole demo, as a newcomer runs it -------------------------------------------------


@pytest.mark.ros
@pytest.mark.slow
def test_demo_script_runs_learns_and_writes_its_results(tmp_path: Path):
    output = tmp_path / "demo"
    env = dict(os.environ, VENV=sys.prefix, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [str(ROOT / "scripts" / "demo.sh"), "--duration", "25", "--deploy-duration", "10", "--output", str(output)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        stop(proc)
    assert proc.returncode == 0, out
    assert (output / "returns.png").stat().st_size > 10_000
    summary = json.loads((output / "summary.json").read_text())
    assert summary["ok"] is True and summary["episodes"] > 0, summary
    assert summary["bridge_exit_code"] == 0 and summary["env_steps"] > 0
    assert summary["infer_round_trip_median_ms"] is not None
    # progress lines while it ran, then the summary: no log flood
    assert "steps/s" in out and "plugrl-demo summary" in out
    assert "[INFO]" not in out
    assert (output / "logs" / "bridge.log").read_text().count("connected to the trainer") == 1
    with np.load(output / "policy.npz", allow_pickle=False) as policy:  # what a linear policy server serves
        assert policy["W"].shape == (2, 8) and policy["b"].shape == (2,) and np.isfinite(policy["W"]).all()
    assert f"learned policy (W, b of its mean action): {output / 'policy.npz'}" in out
    # then the deploy step: that policy, served by a policy server, drove the same robots in deploy mode
    deploy = summary["deploy"]
    assert deploy["episodes"] > 0 and deploy["policy_steps"] > 0, deploy
    assert deploy["bridge_exit_code"] == 0 and deploy["policy_server_exit_code"] == 0, deploy
    assert isinstance(deploy["mean_return"], float), deploy
    assert f"deployed (policy server, mode deploy, 10 s): {deploy['episodes']} episodes" in out
    deploy_log = (output / "logs" / "deploy_bridge.log").read_text()
    assert deploy_log.count("connected to the policy server") == 2  # one connection per robot
    assert "episode 1 " in deploy_log and "the policy server's answer was rejected" not in deploy_log
    assert "listening on" in (output / "logs" / "policy_server.log").read_text()


def test_the_person_share_is_read_from_the_bridge_and_summed_minute_by_minute():
    from plugrl_ros.demo.diagnostics import BridgeStatus, intervention_summary

    trainer = {"connected": "True", "infer round trip median ms": "3.5", "reconnects": "0"}
    statuses = {
        "plugrl_bridge: trainer": ("ok", trainer),
        "plugrl_bridge: env 0 (reacher0)": ("running", {"steps": "100", "episodes": "2", "person steps": "30"}),
        "plugrl_bridge: env 1 (reacher1)": ("running", {"steps": "100", "episodes": "1", "person steps": "10"}),
    }
    assert parse_diagnostics(statuses, 1.0).person_steps == 40

    def status(t: float, steps: int, person: int) -> BridgeStatus:
        return BridgeStatus(t, True, 1.0, steps, 0, 0, person)

    # minute 1: 40 of 100 steps; minute 2: 10 of 100; 20 s of minute 3: 0 of 50
    history = [status(0.0, 0, 0), status(30.0, 50, 30), status(60.0, 100, 40), status(120.0, 200, 50)]
    summary = intervention_summary([*history, status(140.0, 250, 50)], 3.0)
    assert summary["share_by_minute"] == [0.4, 0.1, 0.0]
    assert summary["person_steps"] == 50 and summary["share"] == 0.2 and summary["helping_minutes"] == 3.0
    assert intervention_summary([], 3.0)["share"] is None


@pytest.mark.ros
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_demo_with_a_scripted_person_reports_the_share_and_records_the_persons_commands(tmp_path: Path):
    output = tmp_path / "demo"
    command = executables.command("plugrl_ros.demo.runner", "--teleop", "scripted", "--duration", "30")
    command += ["--deploy-duration", "0", "--output", str(output)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["mode"] == "timer" and summary["ok"] is True, summary
    person = summary["intervention"]
    assert person["person_steps"] > 0 and 0 < person["share"] < 1 and person["share_by_minute"], person
    assert "a person (scripted) commanded" in done.stdout
    recordings = sorted(output.glob("*.mcap"))
    topics = {recorded.topic for _, recorded in read_all(recordings)}
    assert {"/plugrl/env0/person_command", "/plugrl/env0/intervention"} <= topics, sorted(topics)


def test_a_scripted_person_in_lockstep_is_refused(capsys):
    from plugrl_ros.demo.runner import main

    with pytest.raises(SystemExit) as refused:
        main(["--teleop", "scripted", "--mode", "lockstep"])
    assert refused.value.code == 2
    assert "--teleop scripted needs --mode timer" in capsys.readouterr().err


def test_an_algorithm_without_the_rllib_trainer_is_refused_naming_both_options(capsys):
    from plugrl_ros.demo.runner import main

    with pytest.raises(SystemExit) as refused:
        main(["--algorithm", "SAC"])
    assert refused.value.code == 2
    assert "--algorithm SAC needs --trainer rllib" in capsys.readouterr().err


def test_demo_launch_file_starts_the_three_executables_with_the_demo_config():
    source = (ROOT / "launch" / "demo.launch.py").read_text()
    arguments = launch_arguments(ROOT / "launch" / "demo.launch.py")
    assert {"envs", "mode", "rate", "duration", "config"} <= arguments
    assert 'ExecutableInPackage("demo_trainer", "plugrl_ros")' in source
    assert 'executable="demo_robot"' in source and 'executable="bridge"' in source
    assert '"demo.yaml"' in source
    assert executables.EXECUTABLES["plugrl-demo"] == "plugrl_ros.demo.runner"
    for name in ("demo_robot", "plugrl-demo-robot"):
        assert executables.EXECUTABLES[name] == "plugrl_ros.demo.robot_node"
    for name in ("demo_trainer", "plugrl-demo-trainer"):
        assert executables.EXECUTABLES[name] == "plugrl_ros.demo.trainer"


@pytest.mark.ros
@pytest.mark.websockets
def test_the_deploy_step_serves_a_linear_policy_that_reaches_the_target(tmp_path: Path):
    """The demo's own deploy commands, with a known-good linear policy in place of the learned one."""
    from harness import process, python_module, wait_until

    from plugrl_ros.demo.children import deploy_bridge_command
    from plugrl_ros.demo.diagnostics import DiagnosticsWatch
    from plugrl_ros.demo.learned_policy import policy_server_command
    from plugrl_ros.shipped import shipped_file

    # the states in name order: joints (2 angles, 2 velocities), then target (dx, dy, then the joint offsets)
    W = np.zeros((2, 8))
    W[0, 6] = W[1, 7] = 4.0  # a proportional controller toward the target's joint offsets
    np.savez(tmp_path / "policy.npz", W=W, b=np.zeros(2))
    args = SimpleNamespace(envs=1, rate=20.0)
    robot = python_module("plugrl_ros.demo.robot_node", "--envs", "1", "--image-size", "32")
    server = policy_server_command(str(tmp_path / "policy.npz"), horizon=5)
    watch = DiagnosticsWatch()
    try:
        with process(robot), process(server) as served:
            line = wait_until(
                lambda: next((t for t in served.output().splitlines() if t.startswith("listening on")), None),
                60,
                "the policy server listening",
            )
            port = int(line.rsplit(":", 1)[1])
            with process(deploy_bridge_command(args, shipped_file("config", "demo.yaml"), port, 5)) as child:
                try:
                    status = wait_until(
                        lambda: watch.deploy if watch.deploy is not None and watch.deploy.episodes >= 3 else None,
                        120,
                        "three deployed episodes",
                    )
                finally:
                    print(child.output())
    finally:
        watch.close()
    assert status.successes >= 1, status  # the controller reaches the target ...
    assert status.mean_return > -12.5, status  # ... and scores above a zero policy
    assert status.idle_steps == 0 and status.steps > 0, status


@pytest.mark.ros
@pytest.mark.websockets
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["lockstep", "timer"])
def test_episodes_that_reach_the_target_report_success_through_the_bridge(mode):
    """The demo robot's success topic, configured in config/demo.yaml, reaches info["episode"]["s"]."""
    from harness import process, python_module
    from trainer_fixture import ScriptedTrainer

    from plugrl_ros.shipped import shipped_file

    def reach(env_indices, step_ids, observation):  # a proportional controller toward the target's joint offsets
        offsets = np.asarray(observation["states"]["target"])[:, 2:4]
        return np.clip(4.0 * offsets, -2.0, 2.0).astype("<f4")[None]

    robot = python_module("plugrl_ros.demo.robot_node", "--envs", "1", "--mode", mode, "--image-size", "32")
    with ScriptedTrainer({"action_horizon": 1, "action_dim": 2}, reach) as trainer, process(robot):
        bridge = python_module(
            "plugrl_ros.node.bridge_main",
            *("--ros-args", "--params-file", str(shipped_file("config", "demo.yaml"))),
            *("-p", f"trainer.uri:={trainer.uri}", "-p", "envs:=['reacher0']", "-p", f"control.mode:={mode}"),
        )
        with process(bridge) as child:

            def three_ended(records: list) -> list[dict] | None:
                ended = [m for _, m in records if m["message_type"] == "feedback" and m["data"]["info"]]
                return ended if len(ended) >= 3 else None

            try:
                episodes = trainer.wait_for(three_ended, 90, "three episodes ending")
            finally:
                print(child.output())
    rows = [(m["data"]["terminated"][0], m["data"]["info"]["episode"]["s"][0]) for m in episodes]
    assert any(terminated for terminated, _ in rows), rows  # the controller reaches the target
    assert all(bool(success) == bool(terminated) for terminated, success in rows), rows
