"""A PlugRL EnvRunner as a process of its own, for tests that kill it: samples until stopped, one line per sample.

    python rllib_serve.py PORT   (the demo robots' spaces from config/demo.yaml, H = 1)

Prints ``listening on PORT`` and then, after each ``sample()``, the number of
RL steps and bridges as JSON. SIGINT stops the runner (plugrl-server-stop);
SIGKILL is a crash.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from plugrl_ros.rllib import PlugRLEnvRunner
from plugrl_ros.rllib.demo import demo_config

CONFIG = Path(__file__).resolve().parent.parent / "config" / "demo.yaml"


def main() -> int:
    stop = []
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    config = demo_config(CONFIG, port=int(sys.argv[1]))
    config.env_config["plugrl"]["sample_wait_s"] = 1.0
    runner = PlugRLEnvRunner(config=config)
    print(f"listening on {runner.port}", flush=True)
    while not stop:
        episodes = runner.sample(num_timesteps=50)
        line = {"steps": sum(len(e) for e in episodes), "bridges": runner.figures.bridges}
        print(json.dumps(line), flush=True)
    runner.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
