#!/usr/bin/env bash
# Install what is needed into .venv, then lint and run the whole test suite.
#   scripts/test.sh [pytest args...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$root/.venv}"
"$root/scripts/setup-venv.sh" "$VENV" ${ROS_WHEELS:+"$ROS_WHEELS"}
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
cd "$root"
ruff check .
ruff format --check .
exec python -m pytest -n 2 --timeout 300 "$@"
