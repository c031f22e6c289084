"""Every command README.md shows is run here, or mirrored exactly by a named test.

A command added to the README without an entry below fails this test, so
the README cannot drift from what is tested. The same holds for the docs/ pages
the README's reference sections moved to (MOVED): their commands are the
README's, one link away.
"""

from __future__ import annotations

import asyncio
import re
import subprocess

import pytest
from harness import ROOT, python_module, ros_env

from plugrl_ros.tools.test_trainer import TestTrainer, TrainerSettings

README = (ROOT / "README.md").read_text()
# the references the README links to, whose commands and messages were the README's own
MOVED = ("configuration", "deploy", "gym", "networks", "troubleshooting", "compatibility", "how-it-works", "security")
DOCUMENTS = {"README.md": README} | {f"docs/{name}.md": (ROOT / "docs" / f"{name}.md").read_text() for name in MOVED}
TROUBLESHOOTING = DOCUMENTS["docs/troubleshooting.md"]

COLCON = "mirror: test_packaging.py::test_colcon_builds_an_install_tree_whose_bridge_starts_with_the_shipped_config"
LAUNCH = "mirror: test_packaging.py::test_the_launch_file_starts_the_bridge_executable_with_the_shipped_config"
DEMO = "mirror: test_demo.py::test_demo_script_runs_learns_and_writes_its_results"
DEMO_LAUNCH = "mirror: test_demo.py::test_demo_launch_file_starts_the_three_executables_with_the_demo_config"
ROS_PROBE = "mirror: test_probe_ros.py::test_the_ros_probe_passes_every_clause"
HEADLESS = "run: test_the_headless_probe_command_checks_a_trainer_link"
BRIDGE = "mirror: test_bridge_node.py::"
PAUSE = BRIDGE + "test_pausing_idles_the_actuators_truncates_the_running_episode_and_unpausing_resumes"
PIP_BRIDGE = "run: test_the_pip_bridge_command_starts_with_a_params_file_and_an_override"
DEPENDENCIES = "mirror: test_packaging.py::test_every_third_party_import_is_declared_in_package_xml"
GYM = "mirror: test_gym_robot.py::test_the_documented_commands_train_on_a_gymnasium_env_through_ros"
DIAGNOSTICS = BRIDGE + "test_diagnostics_report_the_link_the_achieved_control_rate_and_each_envs_episodes"

WALK_THROUGH_TOOL = "not here: ros2cli is not on PyPI; a standard ROS 2 tool the robot-mapping walk-through uses"

# command prefix -> how it is exercised: "run: <test here>", "mirror: <test file>::<test>", or why not here
EXERCISED = {
    "scripts/demo.sh": DEMO,
    "scripts/test.sh": "run: test_ci_runs_exactly_the_readme_test_command",
    "scripts/bench.sh": "mirror: test_bench_smoke.py::test_the_bench_script_runs_the_benchmarks_and_writes_the_report",
    "mkdir -p ~/plugrl_ws/src": COLCON,
    "cd ~/plugrl_ws": COLCON,
    "git clone": COLCON,
    "source /opt/ros/": "not here: apt ROS 2 is not on these machines; the wheels run the same code",
    "rosdep install": DEPENDENCIES,
    "pip install --user 'websockets>=15'": "mirror: .ci/run (the websocket tests run again with websockets==15.0)",
    "colcon build --packages-select plugrl_ros": COLCON,
    "source install/setup.bash": COLCON,
    "ros2 launch plugrl_ros bridge.launch.py": LAUNCH,
    "ros2 run plugrl_ros bridge --ros-args --params-file": COLCON,
    "ros2 launch plugrl_ros demo.launch.py": DEMO_LAUNCH,
    "plugrl-probe --headless --server ws://HOST:PORT": HEADLESS,
    "plugrl-probe --server ws://": ROS_PROBE,
    "ros2 run plugrl_ros plugrl-probe": ROS_PROBE,
    "plugrl-test-trainer --port 8000 --script resync,stop": HEADLESS,
    "ros2 service call /plugrl_bridge/set_paused": PAUSE,
    "ros2 topic echo /diagnostics": DIAGNOSTICS,
    "ros2 param": "mirror: test_command_line.py::test_every_key_read_is_declared_read_only_with_its_descriptor",
    "ros2 topic info -v": "not here: ros2cli is not on PyPI; a standard ROS 2 tool the troubleshooting table points to",
    "ros2 topic list -t": WALK_THROUGH_TOOL,
    "ros2 action list -t": WALK_THROUGH_TOOL,
    "ros2 service list -t": WALK_THROUGH_TOOL,
    "ros2 interface show": WALK_THROUGH_TOOL,
    "plugrl-bridge --check-config": "mirror: test_check_config.py::"
    "test_a_config_that_resolves_prints_each_envs_observation_and_action_layout_and_exits_0",
    "source scripts/env.sh": PIP_BRIDGE,
    "plugrl-bridge --ros-args --params-file": PIP_BRIDGE,
    # the demo's deploy step builds this command (learned_policy.py) and the bridge's deploy overrides
    "plugrl-test-policy-server": (
        "mirror: test_demo.py::test_the_deploy_step_serves_a_linear_policy_that_reaches_the_target"
    ),
    "plugrl-record-info": (
        "mirror: test_record_tools.py::test_record_info_summarizes_envs_episodes_returns_steps_drops_and_link_events"
    ),
    "plugrl-export --to npz": "mirror: test_record_deploy.py::test_record_info_and_export_read_a_deploy_recording",
    "plugrl-export --to rllib": (
        "mirror: test_rllib_offline.py::test_bc_learns_from_exported_demonstrations_to_reach_the_target_where_a_random_"
        "policy_does_not"
    ),
    "plugrl-export --to lerobot": (
        "mirror: test_lerobot_export.py::test_the_folder_holds_lerobots_v3_layout_with_the_recordings_frames"
    ),
    "OMP_NUM_THREADS=1 python bench/bench_intervention.py": (
        "mirror: test_intervention_bench.py::test_the_benchmark_runs_each_variant_and_reports_success_and_the_"
        "persons_share"
    ),
    "plugrl-demo --teleop scripted": (
        "mirror: test_demo.py::test_the_demo_with_a_scripted_person_reports_the_share_and_records_the_persons_commands"
    ),
    # Gymnasium environments as robots: the three commands and the trainer, run as written in the gym pass
    'scripts/setup-venv.sh .venv kilted "" gym': "mirror: .ci/run (the gym pass sets up its venv this way)",
    "plugrl-gym-robot --env": GYM,
    "plugrl-demo-trainer --action-dim 1": GYM,
    "pip install 'plugrl_ros[gym]'": DEPENDENCIES,
    "ros2 run plugrl_ros gym_robot": "not here: ros2cli is not on PyPI; gym_robot is plugrl-gym-robot's entry point",
    'scripts/setup-venv.sh .venv kilted "" rllib': "mirror: .ci/run (the rllib stage builds its venv this way)",
    # the gym benchmark's direct path; its learning run with RLlib PPO, short (the demo trainer's test draws the plot)
    "python -m plugrl_ros.gym.direct": (
        "mirror: test_gym_bench.py::test_the_gym_benchmark_prints_its_tables_and_its_report_section"
    ),
    "OMP_NUM_THREADS=1 python bench/bench_gym.py --trainer rllib --trainer demo": (
        "mirror: test_gym_bench.py::test_rllib_ppo_learns_from_the_very_same_episodes_on_both_paths"
    ),
    "scripts/fleet.sh": (
        "not here: root, network namespaces and 10-15 minutes of a Ray cluster (a documented command); its shorter "
        "scenario is test_rllib_bridge.py::test_a_bridge_at_its_sites_fixed_address_trains_through_a_runner_that_"
        "ray_restarted_there"
    ),
    "plugrl-demo --trainer rllib": (
        "mirror: test_rllib_bridge.py::test_plugrl_demo_with_rllib_ppo_improves_the_return_through_the_bridge"
    ),
    'scripts/setup-venv.sh .venv kilted "" sb3': "mirror: .ci/run (the rllib stage's venv takes the sb3 extra too)",
    # PPO, short (SAC for 300 s is a measurement in docs/gymnasium-trainers.md)
    "plugrl-demo --trainer sb3 --algorithm SAC": (
        "mirror: test_sb3.py::test_plugrl_demo_with_sb3_ppo_runs_to_the_end_and_deploys_its_model"
    ),
    "plugrl-policy-server --sb3 model.zip --config robot.yaml": (
        "mirror: test_sb3.py::test_the_policy_server_answers_with_the_models_deterministic_action"
    ),
    # the server with the demo's two files (the deploy on the demo reachers), and the bridge that deploys it
    "plugrl-policy-server --lerobot ": (
        "mirror: test_lerobot_policy.py::test_the_bridge_deploys_a_lerobot_policy_on_the_demo_reachers"
    ),
    "scripts/lerobot-check.sh": "not here: 8 minutes and 8 GB of LeRobot's CUDA torch (a documented stage)",
}

_COMMAND_WORDS = (
    "scripts/", "plugrl-", "ros2 ", "colcon ", "rosdep ", "pip ", "git ", "mkdir ", "cd ", "source ", "python ",
    "OMP_NUM_THREADS=",
)  # fmt: skip


def readme_commands(text: str = README) -> list[str]:
    """Commands in fenced shell blocks and in inline code that starts with a command word."""
    commands = []
    # every fence, whatever its language (so that a yaml or python block's fences never pair with another's)
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        if language not in ("", "bash", "sh"):
            continue
        for line in block.splitlines():
            line = line.split("#")[0].strip() if not line.lstrip().startswith("#") else ""
            if line.startswith(_COMMAND_WORDS):
                commands.append(line)
    for inline in re.findall(r"`([^`\n]+)`", text):
        if inline.startswith(_COMMAND_WORDS) and " " in inline:
            commands.append(inline)
    return commands


@pytest.mark.parametrize("document", sorted(DOCUMENTS))
def test_every_readme_command_is_exercised(document):
    commands = readme_commands(DOCUMENTS[document])
    unmapped = [c for c in commands if not any(c.startswith(prefix) for prefix in EXERCISED)]
    assert not unmapped, f"{document}: commands with no test: {unmapped}"


def test_the_readme_links_every_page_its_references_moved_to():
    documentation = README.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    for name in (*MOVED, "recording", "rllib", "performance", "protocol", "design"):
        assert f"](docs/{name}.md)" in documentation, f"README's Documentation list does not link docs/{name}.md"


@pytest.mark.ros
def test_the_readme_params_example_loads_as_a_bridge_config(tmp_path):
    """The minimal params file under "Training your robot" is one the bridge starts with."""
    from test_packaging import flat_params

    from plugrl_ros.ros.config import load_config

    (example,) = [b for b in re.findall(r"^```yaml\n(.*?)^```", README, flags=re.S | re.M) if "ros__parameters" in b]
    (tmp_path / "my_robot.yaml").write_text(example)
    config = load_config(flat_params(tmp_path / "my_robot.yaml"))
    assert config.mode == "train" and [a.name for a in config.actions] == ["arm"], config


def test_every_mirroring_test_exists():
    for how in EXERCISED.values():
        if how.startswith("mirror: test_"):
            file, name = how.removeprefix("mirror: ").split("::")
            assert f"def {name}(" in (ROOT / "test" / file).read_text(), how


def test_the_quick_start_holds_exactly_the_two_commands():
    section = README.split("## Quick start", 1)[1]
    block = re.search(r"```[a-z]*\n(.*?)```", section, flags=re.S).group(1)
    assert [line.strip() for line in block.strip().splitlines()] == ["scripts/demo.sh", "scripts/test.sh"]


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"(?m)^scripts/test\.sh$", ci), "CI must call the README's test command as it is written"
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "setup-venv.sh" in script and "pytest" in script and "ruff check" in script


@pytest.mark.websockets
def test_the_headless_probe_command_checks_a_trainer_link():
    """`plugrl-test-trainer --port 8000 --script resync,stop` and `plugrl-probe --headless --server ...`."""

    async def scenario():
        trainer = TestTrainer(TrainerSettings(port=0, script=("resync", "stop"), feedbacks_per_connection=5))
        port = await trainer.start()
        command = ["plugrl-probe", "--headless", "--server", f"ws://127.0.0.1:{port}", "--envs", "3"]
        probe = await asyncio.create_subprocess_exec(*_installed(command), env=ros_env(), stderr=subprocess.PIPE)
        _, stderr = await asyncio.wait_for(probe.communicate(), 60)
        return probe.returncode, await trainer.finished(30), stderr.decode()

    code, report, stderr = asyncio.run(scenario())
    assert code == 0, stderr
    assert report.failed == 0 and report.text().endswith(f"{report.passed} passed, 0 failed"), report.text()
    assert "the trainer finished the run" in stderr


@pytest.mark.websockets
def test_the_test_trainer_command_prints_its_report():
    command = _installed(["plugrl-test-trainer", "--port", "0", "--script", "resync,stop", "--timeout", "3"])
    out = subprocess.run(command, env=ros_env(), capture_output=True, text=True, timeout=60, check=False)
    assert out.stdout.startswith("listening on ws://127.0.0.1:"), out.stdout + out.stderr
    assert re.search(r"\d+ passed, \d+ failed\n?$", out.stdout)
    assert out.returncode == 2  # nobody connected before --timeout


@pytest.mark.ros
@pytest.mark.websockets
def test_the_pip_bridge_command_starts_with_a_params_file_and_an_override():
    """`source scripts/env.sh` and `plugrl-bridge --ros-args --params-file my_robot.yaml -p trainer.uri:=...`."""
    import signal
    import time

    from harness import process

    command = "source scripts/env.sh && exec plugrl-bridge --ros-args --params-file config/bridge.yaml"
    command += " -p trainer.uri:=ws://127.0.0.1:9"
    with process(["bash", "-c", f"cd {ROOT} && {command}"]) as bridge:
        deadline = time.monotonic() + 30
        while "1 env(s)" not in bridge.output() and bridge.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        started = bridge.output()
        bridge.proc.send_signal(signal.SIGINT)
        code = bridge.wait(15)
    assert "trainer ws://127.0.0.1:9" in started, started
    assert code == 0, bridge.output()


def _installed(command: list[str]) -> list[str]:
    """The console script if installed (as README users run it), else its module."""
    import shutil

    if shutil.which(command[0]):
        return command
    module = {"plugrl-probe": "plugrl_ros.tools.probe", "plugrl-test-trainer": "plugrl_ros.tools.test_trainer"}
    return python_module(module[command[0]], *command[1:])


@pytest.mark.parametrize(
    "fragment",
    [
        "configuration error: ",
        "unknown key under ",
        "did you mean ",
        "cannot reach the trainer at ",
        "offers a QoS this subscription (",
        "(no message yet)",
        "(last message ",
        "does not fit this bridge's configuration: ",
        "but the configured actions read ",
        "no fresh observation for ",
        "waiting for the robot's publishers on ",
        "set control.action_dim",
        "waiting for /clock: use_sim_time is true and no clock message has come",
        "is not available",
        "no step result for ",
        "stopping: ",
        "the trainer sent a text frame",
        "is plain ws:// to another host: the link is unauthenticated",
        "ROS 2 kept ",
        " instead of this value from ",
        "the environment variable ",
        " is not set or empty",
    ],
)
def test_every_troubleshooting_message_is_one_the_package_prints(fragment):
    assert fragment in TROUBLESHOOTING
    sources = "".join(p.read_text() for p in (ROOT / "plugrl_ros").rglob("*.py"))
    assert fragment in sources, f"README quotes a message the package never prints: {fragment!r}"
