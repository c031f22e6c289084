#!/usr/bin/env bash
# Run every benchmark (bench/) and write a Markdown report with plots to bench/results/report.md.
#   scripts/bench.sh [--quick] [--out DIR] [--only NAME ...]
# Takes about 12 minutes (--quick: under a minute). Run it on an otherwise idle machine when the
# absolute numbers matter; the ratios against the in-run baselines are what to compare.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$root/.venv}"
"$root/scripts/setup-venv.sh" "$VENV" ${ROS_WHEELS:+"$ROS_WHEELS"}
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
# A ROS domain of its own: the benchmark's nodes must not meet a test's or anyone else's.
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-93}"
cd "$root"
exec python bench/run_all.py "$@"
