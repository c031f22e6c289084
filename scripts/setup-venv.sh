#!/usr/bin/env bash
# Create (or bring up to date) a venv with the ROS 2 wheels, plugrl_ros's dependencies and plugrl_ros itself.
#
#   scripts/setup-venv.sh [VENV] [kilted|jazzy] [EXTRA_REQUIREMENT] [EXTRAS]
#
# EXTRA_REQUIREMENT (e.g. websockets==15.0) is installed last, over the pinned
# version: how CI tests the oldest supported dependency. EXTRAS (or the EXTRAS
# environment variable) names optional parts of plugrl_ros, comma-separated
# (gym, rllib, sb3, lerobot): each installs the pinned requirements/<name>.txt. A venv
# remembers its wheel set, extra requirement and extras: called again without
# them (as the demo and benchmark scripts do), it keeps them, and EXTRAS given
# later adds to them. Kilted and Jazzy wheels must never mix.
# Idempotent and quick when nothing changed: a stamp records the hash of the
# requirement files, so a second run installs nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.venv}"
mkdir -p "$venv"
venv="$(cd "$venv" && pwd)"
marker="$venv/.plugrl-ros-config"
if [ $# -ge 2 ]; then
    wheels="$2"
    extra="${3:-}"
    extras="${4:-${EXTRAS:-}}"
elif [ -f "$marker" ]; then
    wheels="$(sed -n 1p "$marker")"
    extra="$(sed -n 2p "$marker")"
    extras="$(sed -n 3p "$marker")${EXTRAS:+,$EXTRAS}"
else
    wheels="kilted"
    extra=""
    extras="${EXTRAS:-}"
fi
# the extras as a sorted, unique list of requirement files
extras="$(tr ',' '\n' <<< "$extras" | sed '/^$/d' | sort -u | paste -sd, -)"
extra_files=()
for name in ${extras//,/ }; do
    if [ ! -f "$root/requirements/$name.txt" ]; then
        echo "[setup] unknown extra '$name': there is no requirements/$name.txt" >&2
        exit 2
    fi
    extra_files+=(-r "requirements/$name.txt")
done
if [ -f "$marker" ] && [ "$(sed -n 1p "$marker")" != "$wheels" ]; then
    echo "[setup] $venv holds the $(sed -n 1p "$marker") ROS wheels; it cannot take $wheels (use another venv)" >&2
    exit 2
fi
python="${PYTHON:-python3}"
cd "$root"
# setup.py reads the extras' pins (requirements/gym.txt, rllib.txt, sb3.txt, lerobot*.txt) into the package's metadata:
# hashed always
hash="$( (cat "requirements/ros-$wheels.txt" requirements/base.txt requirements/dev.txt setup.py plugrl_ros/executables.py \
    requirements/gym.txt requirements/rllib.txt requirements/sb3.txt requirements/lerobot.txt \
    requirements/lerobot-policy.txt; echo "$extra"; \
    for name in ${extras//,/ }; do cat "requirements/$name.txt"; done) | sha256sum | cut -c1-16)"
stamp="$venv/.plugrl-ros-setup-$hash"
if [ -f "$stamp" ]; then
    exit 0
fi
echo "[setup] installing into $venv (ROS wheels: $wheels${extra:+, $extra}${extras:+, extras: $extras}); this takes a minute the first time" >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "requirements/ros-$wheels.txt" -r requirements/base.txt -r requirements/dev.txt "${extra_files[@]}"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e .
if [ -n "$extra" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$extra"
fi
printf '%s\n%s\n%s\n' "$wheels" "$extra" "$extras" > "$marker"
rm -f "$venv"/.plugrl-ros-setup-*
touch "$stamp"
