# Source me: the environment plugrl_ros's commands and tests run in (after scripts/setup-venv.sh).
#   VENV    the venv to use (default: .venv at the repository root)
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(cd "${VENV:-$root/.venv}" && pwd)"  # absolute: tests change directory
export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"
# ament_index finds the ROS packages installed as wheels (and their message types) here.
export AMENT_PREFIX_PATH="$VENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
# Keep DDS traffic on this machine: ROS_LOCALHOST_ONLY is ignored by these wheels.
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
export ROS_HOME="${ROS_HOME:-${TMPDIR:-/tmp}/plugrl-ros-home-$(id -un)}"
