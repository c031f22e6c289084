"""``bench/bench_imitation.py --quick``: the imitation loop runs end to end on the demo reachers.

The scripted demonstrator is recorded in teleop mode, ``plugrl-export --to lerobot`` writes the dataset,
LeRobot's own ``lerobot-train`` trains a small ACT for a few steps, ``plugrl-policy-server --lerobot`` serves
it and the bridge deploys it (and a random policy) on the reachers: real processes all along. What a quick
run checks is that every step runs and the table is printed from deployed episodes, not how well ACT does.

Needs LeRobot itself (``lerobot==0.4.4``), so it skips in CI's venvs; ``scripts/lerobot-check.sh`` runs it.
The BC arm needs RLlib, which cannot share LeRobot's venv: with ``PLUGRL_RLLIB_PYTHON`` naming a python that
has the rllib extra it runs too, and without it the table says it was skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("lerobot.scripts.lerobot_train")

from harness import ROOT

pytestmark = [pytest.mark.lerobot, pytest.mark.ros, pytest.mark.slow, pytest.mark.alone]


@pytest.mark.timeout(900)
def test_the_quick_imitation_loop_deploys_act_and_a_random_policy_and_prints_the_table(tmp_path):
    rllib_python = os.environ.get("PLUGRL_RLLIB_PYTHON", str(tmp_path / "no-rllib-python"))
    results = tmp_path / "results.json"
    command = [sys.executable, str(ROOT / "bench" / "bench_imitation.py"), "--quick"]
    command += ["--output", str(tmp_path / "out"), "--json", str(results), "--plot", str(tmp_path / "plot.png")]
    command += ["--rllib-python", rllib_python]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| policy | episodes | success rate | mean return ± sd |" in done.stdout, done.stdout
    table = json.loads(results.read_text())
    assert table["dataset"]["episodes"] >= 10 and table["training"]["act"]["steps"] == 100
    for name in ("ACT (LeRobot)", "random"):
        result = table["results"][name]
        assert result["episodes"] == 10 and len(result["returns"]) == 10, result
    if "PLUGRL_RLLIB_PYTHON" in os.environ:
        assert table["results"]["BC (RLlib)"]["episodes"] == 10
    else:
        assert table["results"]["BC (RLlib)"] is None and "skipped" in done.stdout
    assert (tmp_path / "plot.png").stat().st_size > 0
