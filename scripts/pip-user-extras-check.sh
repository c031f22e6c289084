#!/usr/bin/env bash
# Install plugrl_ros with its trainer-side extras as a pip user would; check it got the versions CI tests.
#
#   scripts/pip-user-extras-check.sh [WORKDIR]
#
# A fresh venv gets the ROS 2 Kilted wheels and a plain `pip install '.[gym,rllib,sb3]'` (not editable, no
# requirement files: the extras' own pins decide). From WORKDIR (default: a new temporary folder), outside the
# checkout, it checks that every installed version equals the one requirements/gym.txt and rllib.txt pin,
# then runs what each extra is for, briefly: plugrl-gym-robot prints the bridge config of a MuJoCo env, and
# plugrl_ros.rllib builds the runner's spaces from that config. The torch build pip chose (CPU or CUDA) is
# printed: `==2.13.0` takes the CPU build wherever pip is offered one (CI's machines have it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${1:-$(mktemp -d -t plugrl-pip-extras-XXXXXX)}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
venv="$work/venv"
pip_quiet=(--quiet --disable-pip-version-check)
echo "=== pip user install of plugrl_ros[gym,rllib,sb3] into $venv ==="
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install "${pip_quiet[@]}" -r "$root/requirements/ros-kilted.txt"
"$venv/bin/python" -m pip install "${pip_quiet[@]}" "$root[gym,rllib,sb3]"
cd "$work"
export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" AMENT_PREFIX_PATH="$venv" PYTHONUNBUFFERED=1
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST ROS_HOME="$work/ros_home" ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-77}"
export OMP_NUM_THREADS=1 MUJOCO_GL="${MUJOCO_GL:-egl}"
unset PYTHONPATH

# every pinned requirement installed at its pinned version (torch's local build label, +cpu, aside)
python - "$root/requirements/gym.txt" "$root/requirements/rllib.txt" "$root/requirements/sb3.txt" <<'EOF'
import importlib.metadata
import sys

from packaging.requirements import Requirement
from packaging.version import Version

import plugrl_ros

if not plugrl_ros.__file__.startswith(sys.prefix):
    sys.exit(f"pip-user-extras-check: plugrl_ros was imported from {plugrl_ros.__file__}, not the venv")
wrong = []
for path in sys.argv[1:]:
    for line in open(path).read().splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        requirement = Requirement(text)
        installed = importlib.metadata.version(requirement.name)
        pinned = next(iter(requirement.specifier)).version
        shown = f"{requirement.name} {installed} (pinned {pinned})"
        print(shown)
        if Version(installed).public != Version(pinned).public:
            wrong.append(shown)
cuda = sorted(d.metadata["Name"] for d in importlib.metadata.distributions() if d.metadata["Name"].startswith("nvidia-"))
torch = importlib.metadata.version("torch")
print(f"torch build: {torch}, " + (f"CUDA ({len(cuda)} nvidia-* wheels)" if cuda else "no nvidia-* wheels"))
if wrong:
    sys.exit(f"pip-user-extras-check: not the versions CI tests: {wrong}")
EOF

echo "=== the extras at work ==="
plugrl-gym-robot --help >/dev/null
plugrl-gym-robot --env InvertedPendulum-v5 --copies 1 --print-config > gym.yaml
python - <<'EOF'
from plugrl_ros.rllib import PlugRLEnvRunner, robot_spaces

# InvertedPendulum-v5: 4 observation values (a width the bridge learns from the messages), 1 action
spaces = robot_spaces("gym.yaml", horizon=1, state_dims={"observation": 4})
assert spaces.observation_space["states"]["observation"].shape == (4,), spaces.observation_space
assert spaces.action_space.shape == (1,), spaces.action_space
print(f"{PlugRLEnvRunner.__name__}: observation {spaces.observation_space}, action {spaces.action_space}")

from plugrl_ros.sb3 import RobotVecEnv
from plugrl_ros.vector import VectorSettings

env = RobotVecEnv.from_params("gym.yaml", 1, VectorSettings(port=0), observation="box", state_dims={"observation": 4})
assert env.observation_space.shape == (4,) and env.action_space.shape == (1,), (env.observation_space, env.action_space)
print(f"{type(env).__name__} listening on port {env.port}: observation {env.observation_space}")
env.close()
EOF
plugrl-policy-server --help | grep -q -- "--sb3"
echo "pip-user-extras-check: passed"
