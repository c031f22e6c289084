#!/usr/bin/env bash
# Create (or bring up to date) a venv with the ROS 2 wheels, plugrl_ros's dependencies and plugrl_ros itself.
#
#   scripts/setup-venv.sh [VENV] [kilted|jazzy] [EXTRA_REQUIREMENT]
#
# EXTRA_REQUIREMENT (e.g. websockets==13.0) is installed last, over the pinned
# version: how CI tests the oldest supported dependency.
#
# Idempotent and quick when nothing changed: a stamp records the hash of the
# requirement files, so a second run installs nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.venv}"
wheels="${2:-kilted}"
extra="${3:-}"
python="${PYTHON:-python3}"
cd "$root"
hash="$( (cat "requirements/ros-$wheels.txt" requirements/base.txt requirements/dev.txt setup.py; echo "$extra") | sha256sum | cut -c1-16)"
stamp="$venv/.plugrl-ros-setup-$wheels-$hash"
if [ -f "$stamp" ]; then
    exit 0
fi
echo "[setup] installing into $venv (ROS wheels: $wheels); this takes a minute the first time" >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "requirements/ros-$wheels.txt" -r requirements/base.txt -r requirements/dev.txt
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e .
if [ -n "$extra" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$extra"
fi
rm -f "$venv"/.plugrl-ros-setup-*
touch "$stamp"
