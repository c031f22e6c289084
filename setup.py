"""Build script: an ament_python ROS 2 package that also installs with plain pip."""

import sys
from glob import glob
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.develop import develop

PACKAGE = "plugrl_ros"
ROOT = Path(__file__).resolve().parent


def pinned(extra: str) -> list[str]:
    """The requirements of an extra: requirements/<extra>.txt, the versions CI tests (one source for both)."""
    lines = (ROOT / "requirements" / f"{extra}.txt").read_text().splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def executables() -> list[str]:
    """Write the executables' scripts (plugrl_ros.executables says why they are scripts); their paths.

    setup.cfg installs them into lib/plugrl_ros, where ``ros2 run`` looks; pip into the environment's bin/.
    """
    sys.path.insert(0, str(ROOT))  # the package being built, not an installed one
    from plugrl_ros.executables import EXECUTABLES, script

    folder = ROOT / "build" / "executables"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in EXECUTABLES:
        path = folder / name
        text = script(name)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
        paths.append(str(path.relative_to(ROOT)))
    return paths


class Develop(develop):
    """``setup.py develop`` (colcon build --symlink-install) installs the executables as they are, their
    ``#!python`` pointed at this Python, not behind setuptools' development wrapper: that imports
    pkg_resources (a second or more on a loaded machine) before their first statement."""

    def install_egg_scripts(self, dist):
        if dist is not self.dist:
            return super().install_egg_scripts(dist)
        for script in self.distribution.scripts or []:
            text = (ROOT / script).read_text()
            first, rest = text.split("\n", 1)
            self.write_script(Path(script).name, first.replace("#!python", f"#!{sys.executable}", 1) + "\n" + rest)
        return None


setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
    ],
    python_requires=">=3.11",
    install_requires=["numpy", "msgpack>=1.0", "websockets>=15.0", "PyYAML", "mcap>=1.2", "mcap-ros2-support>=0.5"],
    # OpenCV comes from apt (python3-opencv, via rosdep) on a robot; a pip-only install adds it with [opencv].
    extras_require={
        "opencv": ["opencv-python-headless"],
        # The trainer-side extras install exactly what CI tests: a pip user resolving them unpinned got a newer
        # Gymnasium and MuJoCo than the tested ones, and a CUDA torch of several GB. Their pins are read from
        # requirements/, which setup-venv.sh installs and CI's pip-user extras check compares against.
        # Gymnasium envs as ROS robots (plugrl-gym-robot)
        "gym": pinned("gym"),
        # plugrl_ros.rllib: an RLlib EnvRunner serving PlugRL
        "rllib": pinned("rllib"),
        # plugrl_ros.vector and plugrl_ros.sb3: Gymnasium trainers and Stable-Baselines3 through a vector env
        "sb3": pinned("sb3"),
        # plugrl-export --to lerobot: LeRobotDataset folders written with pyarrow and PyAV (no LeRobot, no torch)
        "lerobot": pinned("lerobot"),
        # plugrl-policy-server --lerobot: LeRobot's policies with LeRobot itself (its torch pin: a CUDA torch 2.10)
        "lerobot-policy": pinned("lerobot-policy"),
    },
    zip_safe=True,
    maintainer="plugrl_ros maintainers",
    maintainer_email="maintainers@plugrl-ros.dev",
    description="Bridge ROS 2 robots and simulators to a remote PlugRL reinforcement-learning trainer.",
    license="Apache-2.0",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Operating System :: POSIX :: Linux",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    # Every node, trainer and probe is a generated script, not a console-script entry point: Ctrl-C is a
    # stop request from its first statement, before the entry point machinery and the heavy imports.
    scripts=executables(),
    cmdclass={"develop": Develop},
)
