#!/usr/bin/env bash
# The LeRobot stage: the tests that need LeRobot itself, which CI's venvs do not install. LeRobot 0.4.4 pins
# torch < 2.11, which resolves to PyPI's CUDA build of torch 2.10 (about 8 minutes and 8 GB here; it runs on a
# CPU), too heavy for CI's hour. This makes a venv (default .venv-lerobot) with the ROS wheels, the lerobot extra
# and then LeRobot (requirements/lerobot-policy.txt; installed last, in a pip call of its own, because it asks for
# an OpenCV older than the bridge's pin, which it then gets), and runs every test marked lerobot in it: LeRobot's own LeRobotDataset reads what
# plugrl-export --to lerobot wrote, and plugrl-policy-server --lerobot serves ACT and Diffusion Policy as
# LeRobot acts with them, to the bridge on the demo reachers.
#   scripts/lerobot-check.sh [pytest options]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv="${VENV:-$PWD/.venv-lerobot}"
lerobot="$(sed 's/#.*//' requirements/lerobot-policy.txt | xargs)"
scripts/setup-venv.sh "$venv" kilted "$lerobot" lerobot
VENV="$venv" exec bash -c 'source scripts/env.sh && exec python -m pytest -q --timeout 600 -m lerobot "$@"' _ "$@"
