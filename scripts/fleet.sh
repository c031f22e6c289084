#!/usr/bin/env bash
# A fleet on a real multi-node Ray cluster, on this host: a head, two robot-side sites and their robots, each
# in a network namespace of its own (link-local addresses, 169.254/16), Ray started with `ray start` in each
# with token authentication. Trains the demo reachers with RLlib PPO, runs the failure scenarios, prints
# their table and the scale figures, tears everything down. Exit 0 only if every scenario passed.
#   scripts/fleet.sh [--quick] [--out DIR]     (root; the rllib extra: scripts/setup-venv.sh .venv kilted "" rllib)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "$(id -u)" != 0 ]; then
    echo "fleet: needs root (network namespaces, veth pairs, a bridge); run it as root, as CI does" >&2
    exit 2
fi
if ! command -v ip >/dev/null; then
    echo "fleet: \`ip\` is missing (Debian: apt-get install iproute2)" >&2
    exit 2
fi
source scripts/env.sh
if ! python -c "import ray.rllib" 2>/dev/null; then
    echo "fleet: Ray RLlib is not in $VENV (scripts/setup-venv.sh \"\$PWD/.venv\" kilted \"\" rllib)" >&2
    exit 2
fi
export OMP_NUM_THREADS=1
exec python test/fleet/run.py "$@"
