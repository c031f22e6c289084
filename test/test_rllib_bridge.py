"""RLlib trains the demo reachers through ROS and the real bridge: learning, several runners and bridges, a restart.

Real processes throughout: the demo robot node, bridges configured by the
shipped config/demo.yaml, and PlugRL EnvRunners in this process (the demo's
PPO), as Ray actors (two runners, three bridges), or as a process of their
own that is killed and started again.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("ray.rllib")

from harness import ROOT, process, python_module, stop, wait_until

pytestmark = [pytest.mark.rllib, pytest.mark.ros, pytest.mark.websockets, pytest.mark.slow]

DEMO = ROOT / "config" / "demo.yaml"
HERE = Path(__file__).resolve().parent


def robot(envs: int) -> list[str]:
    return python_module("plugrl_ros.demo.robot_node", "--envs", str(envs), "--image-size", "16")


def bridge(name: str, port: int, envs: list[str]) -> list[str]:
    """A bridge with the demo's config, named ``name``, driving ``envs`` for the runner on ``port``."""
    return python_module(
        "plugrl_ros.node.bridge_main",
        *("--ros-args", "-r", f"__node:={name}", "--params-file", str(DEMO)),
        *("-p", f"trainer.uri:=ws://127.0.0.1:{port}", "-p", f"envs:={envs!r}"),
        *("-p", "trainer.reconnect_max_s:=0.5", "-p", "status.log_period_s:=0.0"),
    )


@contextmanager
def reserved_ports(count: int) -> Iterator[int]:
    """A base port whose ``count`` ports (runner i listens on base + i) stay reserved while the block runs.

    Each is bound with SO_REUSEADDR and held, never listened on: the kernel hands none of them to
    anyone else (bind to port 0, a bind without SO_REUSEADDR), while the runners' servers, which set
    SO_REUSEADDR, can listen on them (Linux allows it while the holder does not listen). No window
    between probing a port and binding it, as closing a probe would leave.
    """
    for _ in range(50):
        held: list[socket.socket] = []
        try:
            for k in range(count):
                sock = socket.socket()
                held.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", held[0].getsockname()[1] + k if k else 0))
        except OSError:
            for sock in held:
                sock.close()
            continue
        try:
            yield held[0].getsockname()[1]
        finally:
            for sock in held:
                sock.close()
        return
    raise AssertionError("no block of free ports")


@pytest.mark.timeout(480)  # 150 s of training, Ray's start, then the deploy step: past the suite's 300 s per test
def test_plugrl_demo_with_rllib_ppo_improves_the_return_through_the_bridge(tmp_path: Path):
    """The README's command: PPO's mean return over the last tenth of the episodes beats the first tenth's; then
    plugrl-policy-server --rllib serves the run's checkpoint to the same robots in deploy mode."""
    output = tmp_path / "demo"
    command = [sys.executable, "-m", "plugrl_ros.demo.runner", "--trainer", "rllib", "--duration", "150"]
    command += ["--deploy-duration", "15", "--no-record", "--output", str(output)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        out, _ = proc.communicate(timeout=460)
    finally:
        stop(proc)
    assert proc.returncode == 0, out
    summary = json.loads((output / "summary.json").read_text())
    print(json.dumps(summary, indent=1))
    assert summary["ok"] and summary["bridge_exit_code"] == 0
    # a zero policy scores about -12.5; the first tenth is PPO's initial, noisy policy
    assert summary["env_steps"] > 10_000, summary
    assert summary["last_mean_return"] > summary["first_mean_return"] + 1.0, summary
    assert "plugrl-demo summary" in out and (output / "returns.png").exists()
    deploy = summary["deploy"]  # the deploy step: the checkpoint served, episodes counted by the bridge
    assert deploy["policy_server"] == "plugrl-policy-server --rllib" and deploy["execution"] == "sync", deploy
    assert deploy["episodes"] >= 2 and deploy["mean_return"] is not None, deploy
    assert deploy["bridge_exit_code"] == 0 and deploy["policy_server_exit_code"] == 0, deploy
    assert (output / "rllib_checkpoint" / "rllib_checkpoint.json").is_file()
    log = (output / "logs" / "trainer.log").read_text()
    assert "iteration 1:" in log and "robots idle" in log


def test_two_runners_on_ray_serve_three_bridges_and_end_their_run_with_stop():
    with reserved_ports(3) as base:
        served, codes, results = _two_runners_three_bridges(base)
    assert served == [(base + 1, 2), (base + 2, 1)]
    assert codes == [0, 0, 0]
    runners = results[-1]["env_runners"]
    assert runners["num_env_steps_sampled"] >= 400
    assert runners["plugrl"]["robots_connected"] == 4 and runners["plugrl"]["bridges_connected"] == 3


def _two_runners_three_bridges(base: int) -> tuple[list, list[int], list[dict]]:
    import ray

    from plugrl_ros.rllib.demo import demo_config

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        config = demo_config(DEMO, port=base).env_runners(num_env_runners=2)
        config = config.training(train_batch_size_per_learner=400, minibatch_size=100, num_epochs=2)
        algo = config.build_algo()
        placement = sorted(
            algo.env_runner_group.foreach_env_runner(lambda r: (r.worker_index, r.port), local_env_runner=False)
        )
        assert placement == [(1, base + 1), (2, base + 2)]  # runner i on port + i
        with (
            process(robot(4)),
            process(bridge("bridge_a", base + 1, ["reacher0"])) as a,
            process(bridge("bridge_b", base + 1, ["reacher1"])) as b,
            process(bridge("bridge_c", base + 2, ["reacher2", "reacher3"])) as c,
        ):
            try:
                results = [algo.train() for _ in range(2)]
                served = sorted(
                    algo.env_runner_group.foreach_env_runner(
                        lambda r: (r.port, r.figures.bridges), local_env_runner=False
                    )
                )
                algo.stop()  # every runner ends its run: the bridges exit 0
                codes = [child.wait(60) for child in (a, b, c)]
            finally:
                for child in (a, b, c):
                    print(child.output()[-3000:])
    finally:
        ray.shutdown()
    return served, codes, results


def read_until(proc: subprocess.Popen, predicate) -> None:
    """Read the process's output until a line satisfies ``predicate`` (AssertionError if it ends first)."""
    assert proc.stdout is not None
    seen = []
    while True:
        line = proc.stdout.readline()
        assert line, "the process ended:\n" + "".join(seen[-20:])
        seen.append(line)
        if predicate(line):
            return


def test_a_bridge_reconnects_to_its_runner_after_the_runner_is_killed_and_started_again():
    # reserved throughout: between the kill and the restart nothing else can take the port
    with reserved_ports(1) as port:
        _restart(port)


def _restart(port: int) -> None:
    serve = [sys.executable, str(HERE / "rllib_serve.py"), str(port)]

    def sampled(child) -> bool:
        lines = [json.loads(line) for line in child.output().splitlines() if line.startswith("{")]
        return any(line["steps"] > 0 for line in lines)

    with process(robot(1)):
        first = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            read_until(first, lambda line: line.startswith("listening on"))
            with process(bridge("bridge_r", port, ["reacher0"])) as bridged:
                # the first runner samples steps from the robot ...
                read_until(first, lambda line: line.startswith("{") and json.loads(line)["steps"] > 0)
                first.kill()  # ... and crashes, as a runner whose actor dies
                first.wait(10)
                with process(serve) as second:
                    wait_until(lambda: sampled(second), 90, "the restarted runner sampling the same robot")
                    assert bridged.proc.poll() is None, bridged.output()  # the crash did not end the bridge
                # stopping the second runner ends the run: the bridge exits as a run's end says
                assert bridged.proc.wait(60) == 0, bridged.output()
        finally:
            if first.poll() is None:
                first.kill()
            first.wait(10)


def test_a_bridge_at_its_sites_fixed_address_trains_through_a_runner_that_ray_restarted_there():
    """Ray restarts a killed site runner (restart_failed_env_runners); it listens at the same site address."""
    import ray

    from plugrl_ros.rllib.demo import demo_config

    with reserved_ports(1) as port:
        ray.init(
            num_cpus=2,
            resources={"plugrl_site": 1},
            labels={"plugrl-site": "lab"},
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
        )
        try:
            config = demo_config(DEMO, port=port)
            config.env_config["plugrl"].update(site_label="plugrl-site", sample_wait_s=3.0)
            config = (
                config.env_runners(num_env_runners=1, custom_resources_per_env_runner={"plugrl_site": 1})
                .training(train_batch_size_per_learner=200, minibatch_size=100, num_epochs=1)
                .fault_tolerance(restart_failed_env_runners=True)
            )
            algo = config.build_algo()

            def where(runner):
                return runner.worker_index, runner.site, runner.port, os.getpid()

            (index, site, served, pid) = algo.env_runner_group.foreach_env_runner(where, local_env_runner=False)[0]
            assert (site, served) == ("lab", port)  # the site's fixed port, not port + worker index
            with process(robot(2)), process(bridge("bridge_s", port, ["reacher0", "reacher1"])) as bridged:
                first = algo.train()["env_runners"]["num_env_steps_sampled"]
                os.kill(pid, 9)  # the runner's process dies, as on a crash
                after = []
                for _ in range(30):  # a bound: each iteration takes at most a few seconds
                    result = algo.train()
                    runners = algo.env_runner_group.foreach_env_runner(where, local_env_runner=False)
                    if runners and runners[0][3] != pid and "(connection 2)" in bridged.output():
                        after.append(result["env_runners"].get("num_env_steps_sampled", 0))
                        if after[-1]:
                            break
                output = bridged.output()
            algo.stop()
        finally:
            ray.shutdown()
    assert first > 0
    assert runners[0][:3] == (index, "lab", port) and runners[0][3] != pid, runners
    assert after and after[-1] > 0, output[-3000:]  # trained on steps from the restarted runner
    assert "(connection 2)" in output  # the bridge reconnected to the same address


def test_a_site_runner_on_a_node_without_the_site_label_refuses_to_start_naming_the_fix():
    import ray

    from plugrl_ros.rllib import PlugRLEnvRunner
    from plugrl_ros.rllib.demo import demo_config

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        config = demo_config(DEMO, port=0)
        config.env_config["plugrl"]["site_label"] = "plugrl-site"
        with pytest.raises(ValueError, match=r'\["site_label"\] is .plugrl-site.*ray start --labels plugrl-site='):
            PlugRLEnvRunner(config=config)
    finally:
        ray.shutdown()
