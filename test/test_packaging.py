"""Packaging: colcon builds an install tree ROS users can run, every shipped config loads, deps are declared."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from harness import ROOT, launch_arguments, process, ros_env

from plugrl_ros.params.section import ConfigError
from plugrl_ros.ros.config import load_config

pytestmark = [pytest.mark.ros]

SHIPPED_CONFIGS = sorted(p.name for p in (ROOT / "config").glob("*.yaml"))


def flat_params(path: Path) -> dict:
    """The parameters a node gets from ``--params-file path`` (the /** section), flattened."""
    from rclpy.parameter import parameter_dict_from_yaml_file

    params = parameter_dict_from_yaml_file(str(path), use_wildcard=True)
    from rclpy.parameter import parameter_value_to_python

    return {name: parameter_value_to_python(value.value) for name, value in params.items()}


# a second --params-file over a shipped config, with the -p overrides its comment gives
OVERLAYS = {
    "demo_intervention.yaml": ("demo.yaml", {"control.mode": "timer"}),
    "demo_lerobot.yaml": ("demo.yaml", {"mode": "deploy"}),
}


@pytest.mark.parametrize("name", SHIPPED_CONFIGS)
def test_every_shipped_config_is_valid(name):
    params = flat_params(ROOT / "config" / name)
    if name in OVERLAYS:
        base, overrides = OVERLAYS[name]
        params = {**flat_params(ROOT / "config" / base), **overrides, **params}
    config = load_config(params)
    assert config.actions and (config.images or config.states)
    if name == "demo_intervention.yaml":
        assert config.intervention is not None
    if name == "demo_lerobot.yaml":  # the image joins the states the demo sends; H is the server's
        sent = {item.source for item in config.policy.layout.inputs}
        assert sent == {"states.joints", "states.target", "images.camera"} and config.policy.action_horizon == 0


def test_a_shipped_config_with_a_typo_fails_naming_the_key(tmp_path):
    text = re.sub(r"(?m)^(\s+)rate_hz:", r"\1rate_hz_typo:", (ROOT / "config" / "bridge.yaml").read_text(), count=1)
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"control\.rate_hz_typo: .*did you mean 'rate_hz'"):
        load_config(flat_params(tmp_path / "bad.yaml"))


def _imported(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name.split(".")[0] for alias in node.names}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return {node.module.split(".")[0]}
    return set()


def _package_imports() -> tuple[set[str], set[str]]:
    """(required, optional) top-level modules; optional = imported only where ImportError is caught."""
    required, optional = set(), set()
    for path in (ROOT / "plugrl_ros").rglob("*.py"):
        if path.relative_to(ROOT / "plugrl_ros").parts[0] in OPTIONAL_EXTRAS:
            continue  # pip extras for the trainer's side, never on a robot (test_the_extras_...)
        tree = ast.parse(path.read_text())
        guarded = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers
            ):
                guarded.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
        for node in ast.walk(tree):
            (optional if id(node) in guarded else required).update(_imported(node))
    return required, optional - required


# plugrl_ros subpackages that are pip extras (setup.py extras_require), not robot dependencies
OPTIONAL_EXTRAS = ("rllib", "gym", "sb3", "lerobot", "lerobot_policy")
# an extra's third-party imports -> the requirement in its extras_require entry that brings them
_EXTRA_REQUIREMENTS = {
    "rllib": {
        "ray": "ray[rllib]",
        "torch": "torch",
        "gymnasium": "ray[rllib]",
        "pyarrow": "ray[rllib]",
        "msgpack_numpy": "msgpack-numpy",
    },
    "sb3": {"stable_baselines3": "stable-baselines3", "torch": "torch", "gymnasium": "gymnasium"},
    "lerobot": {"pyarrow": "pyarrow", "av": "av"},
    # plugrl-policy-server --lerobot: LeRobot itself, which brings its torch and Gymnasium
    "lerobot_policy": {"lerobot": "lerobot", "torch": "lerobot", "gymnasium": "lerobot"},
}
# a subpackage whose extra is not named as it is
_SUBPACKAGE_EXTRAS = {"lerobot_policy": "lerobot-policy"}


def extra_requirements(extra: str) -> list[str]:
    """An extra's requirements as setup.py declares them: requirements/<extra>.txt, comments dropped."""
    setup = (ROOT / "setup.py").read_text()
    assert f'"{extra}": pinned("{extra}")' in setup, f"setup.py's {extra} extra is not read from requirements/"
    lines = (ROOT / "requirements" / f"{extra}.txt").read_text().splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


@pytest.mark.parametrize("extra", [_SUBPACKAGE_EXTRAS.get(name, name) for name in OPTIONAL_EXTRAS])
def test_each_trainer_side_extra_pins_exactly_the_versions_ci_installs(extra):
    """A pip user's `pip install 'plugrl_ros[gym,rllib]'` resolves the versions CI tests, not the newest
    (a CUDA torch of several GB, a MuJoCo the Gymnasium envs warn about): every requirement is pinned, and
    the installed package's metadata carries requirements/<extra>.txt as it is."""
    import importlib.metadata

    requirements = extra_requirements(extra)
    assert requirements and all("==" in r for r in requirements), requirements
    declared = importlib.metadata.requires("plugrl_ros") or []
    marker = f'; extra == "{extra}"'
    installed = sorted(r.removesuffix(marker).replace(" ", "") for r in declared if r.endswith(marker))
    pinned = sorted(r.replace(" ", "") for r in requirements)
    assert [_canonical(r) for r in installed] == [_canonical(r) for r in pinned], "reinstall: scripts/setup-venv.sh"


def _canonical(requirement: str) -> str:
    from packaging.requirements import Requirement

    parsed = Requirement(requirement)
    return f"{parsed.name.lower()}[{','.join(sorted(parsed.extras))}]{parsed.specifier}"


# third-party import -> the rosdep key package.xml must declare for it
_ROSDEP_KEYS = {
    "numpy": "python3-numpy",
    "msgpack": "python3-msgpack",
    "websockets": "python3-websockets",
    "cv2": "python3-opencv",
    "yaml": "python3-yaml",
    "ament_index_python": "ament_index_python",
    "launch": "launch",
    "launch_ros": "launch_ros",
}


# third-party imports no apt repository packages (so no rosdep key): setup.py must require them
# (pip installs them; README's robot steps say so)
_PIP_ONLY = {"mcap": "mcap", "mcap_ros2": "mcap-ros2-support"}

# imports of an optional extra's modules only: setup.py's extras_require[extra] must name them (no rosdep key)
_EXTRA_ONLY = {"gymnasium": "gym"}


def test_every_third_party_import_is_declared_in_package_xml():
    root = ET.parse(ROOT / "package.xml").getroot()
    assert root.get("format") == "3"
    declared = {e.text for e in root if e.tag in ("depend", "exec_depend")}
    stdlib = set(sys.stdlib_module_names)
    launch_files = {"launch", "launch_ros"}  # imported by launch/*.py, not the package
    missing = []
    install_requires = (ROOT / "setup.py").read_text().split("install_requires=", 1)[1].split("\n", 1)[0]
    required, _ = _package_imports()
    for module in sorted(required - stdlib - {"plugrl_ros"}):
        if module in _EXTRA_ONLY:
            if not any(r.startswith(module) for r in extra_requirements(_EXTRA_ONLY[module])):
                missing.append(f"{module} -> requirements/{_EXTRA_ONLY[module]}.txt (setup.py extras_require)")
            continue
        if module in _PIP_ONLY:
            if f'"{_PIP_ONLY[module]}' not in install_requires:
                missing.append(f"{module} -> setup.py install_requires {_PIP_ONLY[module]}")
            continue
        key = _ROSDEP_KEYS.get(module, module)  # ROS packages: the module is the key (rclpy, std_msgs, ...)
        if key not in declared:
            missing.append(f"{module} -> {key}")
    assert not missing, f"undeclared in package.xml: {missing}"
    assert launch_files <= declared


@pytest.mark.parametrize("extra", sorted(_EXTRA_REQUIREMENTS))
def test_a_trainer_extras_imports_come_with_its_extras_require_and_stay_out_of_package_xml(extra):
    required = extra_requirements(_SUBPACKAGE_EXTRAS.get(extra, extra))
    imported = set()
    for path in (ROOT / "plugrl_ros" / extra).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            imported.update(_imported(node))
    third_party = imported - set(sys.stdlib_module_names) - {"plugrl_ros"} - set(_ROSDEP_KEYS) - set(_PIP_ONLY)
    assert third_party == set(_EXTRA_REQUIREMENTS[extra]), third_party
    for requirement in _EXTRA_REQUIREMENTS[extra].values():
        assert any(r.startswith(requirement) for r in required), f"the {extra} extra does not require {requirement}"
    declared = {e.text for e in ET.parse(ROOT / "package.xml").getroot()}
    assert not declared & {"ray", "torch", "gymnasium", "python3-torch"}, "rosdep would pull the trainer onto robots"


def test_the_python_versions_claimed_are_the_ones_setup_py_allows():
    setup = (ROOT / "setup.py").read_text()
    oldest = re.search(r'python_requires=">=3\.(\d+)"', setup).group(1)
    classified = re.findall(r'"Programming Language :: Python :: 3\.(\d+)"', setup)
    assert min(classified) == oldest
    readme = (ROOT / "README.md").read_text()
    assert f"Python 3.{oldest} or newer" in readme
    assert sys.version_info >= (3, int(oldest)), "the suite runs on a Python setup.py refuses"


def test_the_demo_plot_is_optional_on_a_robot_and_installed_by_the_pip_requirements():
    required, optional = _package_imports()
    assert "matplotlib" in optional and "matplotlib" not in required
    root = ET.parse(ROOT / "package.xml").getroot()
    assert "python3-matplotlib" not in {e.text for e in root}, "rosdep would pull the demo's plotting onto robots"
    assert re.search(r"(?m)^matplotlib==", (ROOT / "requirements" / "base.txt").read_text())


def test_the_launch_file_starts_the_bridge_executable_with_the_shipped_config():
    source = (ROOT / "launch" / "bridge.launch.py").read_text()
    arguments = launch_arguments(ROOT / "launch" / "bridge.launch.py")
    assert arguments == {"config", "overlay", "mode", "server_uri", "policy_uri", "namespace", "log_level"}
    assert 'executable="bridge"' in source and '"bridge.yaml"' in source
    from plugrl_ros.executables import EXECUTABLES

    assert EXECUTABLES["bridge"] == "plugrl_ros.node.bridge_main"


@pytest.mark.ros
@pytest.mark.slow
@pytest.mark.parametrize("symlink", [False, True], ids=["install", "symlink-install"])
def test_colcon_builds_an_install_tree_whose_bridge_starts_with_the_shipped_config(tmp_path, symlink):
    colcon = shutil.which("colcon")
    if colcon is None:
        pytest.fail("colcon is not installed; it is in requirements/dev.txt")
    source = tmp_path / "src" / "plugrl_ros"
    ignore = shutil.ignore_patterns(
        ".git", ".venv*", "build", "install", "log", "__pycache__", "*.egg-info", ".pytest_cache", "demo-output"
    )
    shutil.copytree(ROOT, source, ignore=ignore)
    built = subprocess.run(
        [colcon, "build", "--base-paths", "src", *(["--symlink-install"] if symlink else [])],
        cwd=tmp_path,
        env=ros_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    prefix = tmp_path / "install" / "plugrl_ros"
    share = prefix / "share" / "plugrl_ros"
    assert (share / "launch" / "bridge.launch.py").is_file()
    assert {p.name for p in (share / "config").glob("*.yaml")} == set(SHIPPED_CONFIGS)
    assert (prefix / "share" / "ament_index" / "resource_index" / "packages" / "plugrl_ros").is_file()
    bridge = prefix / "lib" / "plugrl_ros" / "bridge"
    assert bridge.is_file() and os.access(bridge, os.X_OK)
    from plugrl_ros.executables import EXECUTABLES, RAY_DRIVERS

    for name in EXECUTABLES:  # what ros2 run starts: the scripts, run with -S, handlers first (no wrapper)
        text = (prefix / "lib" / "plugrl_ros" / name).read_text()
        flags = "" if EXECUTABLES[name] in RAY_DRIVERS else " -S"  # Ray passes -S on to its workers
        assert text.startswith(f"#!{sys.executable}{flags}\n"), text
        assert first_statements_install_the_stop_handlers(text), text

    site = next(prefix.glob("lib/python3*/site-packages"))
    env = ros_env()
    env["AMENT_PREFIX_PATH"] = f"{prefix}{os.pathsep}{env['AMENT_PREFIX_PATH']}"
    env["PYTHONPATH"] = str(site)  # the installed package, not the source tree
    command = [str(bridge), "--ros-args", "--params-file", str(share / "config" / "bridge.yaml")]
    command += ["-p", "trainer.uri:=ws://127.0.0.1:9"]
    with process(command, env=env) as child:
        assert _wait_for_text(child, "env(s):", 30), child.output()
        assert child.stop() == 0, child.output()
    # the installed tree's shipped files are found through the ament index
    assert _shipped_probe_config(env).startswith(str(share))


def _wait_for_text(child, text: str, timeout: float) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in child.output():
            return True
        if child.proc.poll() is not None:
            return text in child.output()
        time.sleep(0.1)
    return False


def _shipped_probe_config(env: dict) -> str:
    out = subprocess.run(
        [sys.executable, "-c", "import plugrl_ros.shipped as s; print(s.shipped_file('config', 'probe.yaml'))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def first_statements_install_the_stop_handlers(text: str) -> bool:
    """An executable's first statements import only the builtin _signal and record SIGINT and SIGTERM with it."""
    body = ast.parse(text).body
    first = body[0]
    if not (isinstance(first, ast.Import) and [a.name for a in first.names] == ["_signal", "sys"]):
        return False
    handlers = next((i for i, node in enumerate(body) if isinstance(node, ast.For)), None)
    if handlers is None or "_signal.signal" not in ast.unparse(body[handlers]):
        return False
    return not any(isinstance(node, ast.Import | ast.ImportFrom) for node in body[1:handlers])


def test_every_executable_starts_with_the_stop_handlers_before_its_heavy_imports():
    import importlib

    from plugrl_ros import executables

    operated = {"bridge", "plugrl-probe", "plugrl-test-trainer", "demo_trainer", "demo_robot", "probe_robot"}
    assert operated <= set(executables.EXECUTABLES)
    for name, module in executables.EXECUTABLES.items():
        assert callable(importlib.import_module(module).main), f"{name} -> {module}"
        text = executables.script(name)
        # an installer points it at its Python (colcon keeps -S); a Ray driver starts without (Ray's workers would
        # be started with -S too, and could not import Ray)
        assert text.startswith("#!python\n" if module in executables.RAY_DRIVERS else "#!python -S\n"), name
        assert ("-S" in executables.command(module)) is (module not in executables.RAY_DRIVERS)
        assert first_statements_install_the_stop_handlers(text), text
        assert f"run_module(early, {module!r})" in text
    # the installed executables are these scripts (pip: in the environment's bin/), not entry-point wrappers
    for name in executables.EXECUTABLES:
        installed = (Path(sys.executable).parent / name).read_text()
        assert installed.startswith(f"#!{sys.executable}") and first_statements_install_the_stop_handlers(installed)
        assert "importlib.metadata" not in installed and "pkg_resources" not in installed, installed
    # the light modules import nothing heavy: the handlers are in place before rclpy is
    light = [ROOT / "plugrl_ros" / "executables.py", ROOT / "plugrl_ros" / "stop_request.py"]
    light.append(ROOT / "plugrl_ros" / "node" / "bridge_main.py")
    for path in light:
        modules = set()
        for node in ast.parse(path.read_text()).body:  # top-level imports only
            if isinstance(node, ast.Import):
                modules.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules.add(node.module)
        heavy = {m for m in modules if m.split(".")[0] in ("rclpy", "numpy", "websockets", "cv2", "asyncio")}
        assert not heavy, f"{path.name} imports {heavy} before the handlers are installed"


def test_a_child_process_runs_the_installed_package_not_the_one_in_its_current_directory(tmp_path):
    from plugrl_ros import executables

    # a checkout-like directory whose plugrl_ros would shadow the installed one under `python -m`
    (tmp_path / "plugrl_ros").mkdir()
    (tmp_path / "plugrl_ros" / "__init__.py").write_text("raise ImportError('imported from the current directory')\n")
    command = executables.command("plugrl_ros.tools.test_trainer", "--help")
    done = subprocess.run(command, check=False, cwd=tmp_path, env=ros_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "plugrl-test-trainer" in done.stdout
    shadowed = subprocess.run(
        [sys.executable, "-m", "plugrl_ros.tools.test_trainer", "--help"],
        check=False,
        cwd=tmp_path,
        env=ros_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "imported from the current directory" in shadowed.stderr  # what `python -m` would have done


def _without_opencv(tmp_path: Path) -> dict[str, str]:
    """The environment of a process in which ``import cv2`` fails, as after a plain ``pip install .``."""
    return _without(tmp_path, "cv2")


def _without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """The environment of a process in which importing each of ``modules`` fails."""
    blocked = tmp_path / "blocked"
    for module in modules:
        (blocked / module).mkdir(parents=True)
        (blocked / module / "__init__.py").write_text(f"raise ImportError(\"No module named '{module}'\")\n")
    env = ros_env()
    env["PYTHONPATH"] = str(blocked) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.ros
def test_without_opencv_an_image_source_fails_at_startup_naming_what_to_install(tmp_path):
    params = tmp_path / "bridge.yaml"
    params.write_text(
        "/**:\n  ros__parameters:\n    trainer: {uri: 'ws://127.0.0.1:9'}\n"
        "    observations:\n      images:\n        camera: {topic: image, type: sensor_msgs/Image}\n"
        "    actions:\n      cmd: {topic: cmd, type: std_msgs/Float64MultiArray, slice: [0, 1]}\n"
    )
    command = executables_command("plugrl_ros.node.bridge_main", "--ros-args", "--params-file", str(params))
    done = subprocess.run(
        command, check=False, env=_without_opencv(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "observations.images.camera: " in done.stderr and "need OpenCV" in done.stderr, done.stderr
    assert "plugrl_ros[opencv]" in done.stderr and "python3-opencv" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.ros
def test_without_opencv_the_bridge_starts_for_a_config_without_images(tmp_path):
    params = ROOT / "config" / "probe.yaml"
    command = executables_command("plugrl_ros.node.bridge_main", "--ros-args", "--params-file", str(params))
    with process(command, env=_without_opencv(tmp_path)) as child:
        assert _wait_for_text(child, "env(s):", 30), child.output()
        assert child.stop() == 0, child.output()
    assert "Traceback" not in child.output()


def test_without_mcap_the_bridge_starts_when_not_recording(tmp_path):
    # mcap has no apt package: a robot installed with rosdep may lack it, and only recording needs it.
    params = ROOT / "config" / "probe.yaml"
    command = executables_command("plugrl_ros.node.bridge_main", "--ros-args", "--params-file", str(params))
    with process(command, env=_without(tmp_path, "mcap", "mcap_ros2")) as child:
        assert _wait_for_text(child, "env(s):", 30), child.output()
        assert child.stop() == 0, child.output()
    assert "Traceback" not in child.output()


def test_without_mcap_recording_fails_at_startup_naming_the_key_and_what_to_install(tmp_path):
    params = ROOT / "config" / "probe.yaml"
    command = executables_command(
        "plugrl_ros.node.bridge_main", "--ros-args", "--params-file", str(params), "-p", f"record.path:={tmp_path}"
    )
    done = subprocess.run(
        command, check=False, env=_without(tmp_path, "mcap", "mcap_ros2"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "record.path: " in done.stderr and "pip install mcap mcap-ros2-support" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.ros
def test_without_opencv_the_demo_trainer_writes_its_results_and_the_demo_robot_says_what_to_install(tmp_path):
    import signal

    env = _without_opencv(tmp_path)
    out = tmp_path / "results"
    command = executables_command("plugrl_ros.demo.trainer", "--port", "0", "--output", str(out))
    with process(command, env=env) as child:
        assert _wait_for_text(child, "listening on", 30), child.output()
        child.proc.send_signal(signal.SIGINT)
        assert child.wait(30) == 0, child.output()
    assert (out / "summary.json").is_file(), child.output()
    assert "Traceback" not in child.output(), child.output()
    robot = subprocess.run(
        executables_command("plugrl_ros.demo.robot_node"),
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert robot.returncode == 2, robot.stderr
    assert "OpenCV" in robot.stderr and "plugrl_ros[opencv]" in robot.stderr, robot.stderr


def executables_command(module: str, *args: str) -> list[str]:
    from plugrl_ros import executables

    return executables.command(module, *args)
