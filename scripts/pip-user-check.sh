#!/usr/bin/env bash
# Install plugrl_ros as a pip user would, then run the probe over ROS against the test trainer.
#
#   scripts/pip-user-check.sh [WORKDIR]
#
# A fresh venv gets the ROS 2 Kilted wheels and `pip install .` (no extras: no OpenCV; not editable:
# the data files go to share/). Everything then runs from WORKDIR (default: a new temporary folder),
# outside the checkout, so nothing can import plugrl_ros from the source tree.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${1:-$(mktemp -d -t plugrl-pip-user-XXXXXX)}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
venv="$work/venv"
pip_quiet=(--quiet --disable-pip-version-check)
echo "=== pip user install into $venv ==="
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install "${pip_quiet[@]}" -r "$root/requirements/ros-kilted.txt"
"$venv/bin/python" -m pip install "${pip_quiet[@]}" "$root"
cd "$work"
export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" AMENT_PREFIX_PATH="$venv" PYTHONUNBUFFERED=1
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST ROS_HOME="$work/ros_home" ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-77}"
unset PYTHONPATH

if python -c "import cv2" 2>/dev/null; then
    echo "pip-user-check: OpenCV is importable; this check is about an install without it" >&2
    exit 1
fi
location="$(python -c "import plugrl_ros, sys; sys.stdout.write(plugrl_ros.__file__)")"
case "$location" in
    "$venv"/*) ;;
    *) echo "pip-user-check: plugrl_ros was imported from $location, not the venv" >&2; exit 1 ;;
esac
# what needs OpenCV says what to install, and nothing else does
set +e
robot="$(plugrl-demo-robot 2>&1)"; robot_code=$?
set -e
if [ "$robot_code" != 2 ] || [[ "$robot" != *"plugrl_ros[opencv]"* ]]; then
    echo "pip-user-check: plugrl-demo-robot without OpenCV exited $robot_code: $robot" >&2
    exit 1
fi

trainer_log="$work/test-trainer.log"
plugrl-test-trainer --port 0 --script resync,stop --feedbacks 12 --n-envs 2 --timeout 180 >"$trainer_log" 2>&1 &
trainer=$!
port=""
for _ in $(seq 300); do  # its first line names the port it listens on
    port="$(sed -n 's/^listening on ws:\/\/127\.0\.0\.1:\([0-9]*\)$/\1/p' "$trainer_log")"
    [ -n "$port" ] || ! kill -0 "$trainer" 2>/dev/null && break
    sleep 0.1
done
if [ -z "$port" ]; then
    echo "pip-user-check: the test trainer did not start:" >&2
    cat "$trainer_log" >&2
    exit 1
fi
echo "=== plugrl-probe (ROS: probe robot + bridge) against the test trainer on port $port ==="
set +e
timeout 300 plugrl-probe --server "ws://127.0.0.1:$port" --envs 2 --mode lockstep
probe_code=$?
wait "$trainer"
trainer_code=$?
set -e
cat "$trainer_log"
if [ "$probe_code" != 0 ] || [ "$trainer_code" != 0 ]; then
    echo "pip-user-check: plugrl-probe exited $probe_code, the test trainer $trainer_code" >&2
    exit 1
fi
echo "pip-user-check: passed"
