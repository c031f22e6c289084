"""``plugrl-policy-server``'s light entry point: it reads the command line, then serves with the chosen backend.

The executables import their module before anything else runs (plugrl_ros.executables),
and the backends import Ray or torch: without the extra that would be an
ImportError's traceback, not a sentence a user can act on. So the command line
is read here first (``--help`` works without any extra), and a missing extra
is named with the command that installs it.
"""

from __future__ import annotations

import importlib
import sys

from plugrl_ros.serve.policy_server import EXIT_BAD_INPUT, SERVER_NAME, parse

# backend -> (the module that must import, what to install, the module that serves)
BACKENDS = {
    "rllib": (
        "ray.rllib",
        "install the rllib extra: pip install 'plugrl_ros[rllib]' (Ray RLlib and torch), "
        'or in a checkout scripts/setup-venv.sh .venv kilted "" rllib',
        "plugrl_ros.rllib.policy_server",
    ),
    "sb3": (
        "stable_baselines3",
        "install the sb3 extra: pip install 'plugrl_ros[sb3]' (Stable-Baselines3 and torch), "
        'or in a checkout scripts/setup-venv.sh .venv kilted "" sb3',
        "plugrl_ros.sb3.policy_server",
    ),
    "lerobot": (
        "lerobot.policies.factory",
        "install the lerobot-policy extra: pip install 'plugrl_ros[lerobot-policy]' (LeRobot 0.4.4 and its torch), "
        'or in a checkout scripts/setup-venv.sh .venv-lerobot kilted "" lerobot,lerobot-policy',
        "plugrl_ros.lerobot_policy.policy_server",
    ),
}


def missing(module: str) -> str | None:
    """Why ``module`` cannot be imported (the ImportError's text), or None if it can."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return str(exc) or f"{module} is not installed"
    return None


def main(args: list[str] | None = None) -> int:
    options = parse(args)
    backend = next(name for name in BACKENDS if getattr(options, name) is not None)
    needed, install, serving = BACKENDS[backend]
    problem = missing(needed)
    if problem is not None:
        print(f"{SERVER_NAME}: --{backend} needs {needed} ({problem}); {install}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return int(importlib.import_module(serving).serve(options))


if __name__ == "__main__":
    sys.exit(main())
