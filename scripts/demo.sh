#!/usr/bin/env bash
# The first thing to run: install everything into .venv (first time only), then the demo.
#   scripts/demo.sh [plugrl-demo options]     e.g. --duration 300 --envs 4 --mode timer --rate 50
# A simulated reacher robot (a real ROS 2 node), the bridge configured by config/demo.yaml and a
# small local trainer learn together for a few minutes; results (plot, CSV, the bridge's .mcap
# recording of every transition) land in demo-output/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$root/.venv}"
"$root/scripts/setup-venv.sh" "$VENV" ${ROS_WHEELS:+"$ROS_WHEELS"}
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
exec plugrl-demo "$@"
