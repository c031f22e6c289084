"""Build script: an ament_python ROS 2 package that also installs with plain pip."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "plugrl_ros"

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
        # plugrl_ros.rllib: an RLlib EnvRunner serving PlugRL (pinned in requirements/rllib.txt)
        "rllib": ["ray[rllib]>=2.60,<2.61", "torch"],
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
    entry_points={
        "console_scripts": [
            # Every node, trainer and probe starts through plugrl_ros.executables (the bridge through its
            # own light module): Ctrl-C is safe from its first moment, before the heavy imports.
            "bridge = plugrl_ros.node.bridge_main:main",
            "demo_robot = plugrl_ros.executables:demo_robot",
            "demo_trainer = plugrl_ros.executables:demo_trainer",
            "probe_robot = plugrl_ros.executables:probe_robot",
            "test_trainer = plugrl_ros.executables:test_trainer",
            "plugrl-bridge = plugrl_ros.node.bridge_main:main",
            "plugrl-demo = plugrl_ros.executables:demo",
            "plugrl-demo-robot = plugrl_ros.executables:demo_robot",
            "plugrl-demo-trainer = plugrl_ros.executables:demo_trainer",
            "plugrl-probe = plugrl_ros.executables:probe",
            "plugrl-probe-robot = plugrl_ros.executables:probe_robot",
            "plugrl-test-policy-server = plugrl_ros.executables:test_policy_server",
            "plugrl-test-trainer = plugrl_ros.executables:test_trainer",
            "plugrl-record-info = plugrl_ros.record.info:main",
            "plugrl-export = plugrl_ros.record.export:main",
        ],
    },
)
