"""``plugrl-gym-robot``'s light entry point: without the gym extra it says how to install it, else it runs the node.

The executables import their module before anything else runs (plugrl_ros.executables),
and the gym robot's modules import Gymnasium: without the extra that would be an
ImportError's traceback, not a sentence a user can act on.
"""

from __future__ import annotations

import sys

INSTALL = (
    "install the gym extra: pip install 'plugrl_ros[gym]' (Gymnasium and MuJoCo), "
    'or in a checkout scripts/setup-venv.sh .venv kilted "" gym'
)


def missing() -> str | None:
    """Why Gymnasium cannot be imported (the ImportError's text), or None if it can."""
    try:
        import gymnasium  # noqa: F401
    except ImportError as exc:
        return str(exc) or "gymnasium is not installed"
    return None


def main(args: list[str] | None = None) -> int:
    problem = missing()
    if problem is not None:
        print(f"plugrl-gym-robot: needs Gymnasium ({problem}); {INSTALL}", file=sys.stderr)
        return 2
    from plugrl_ros.gym.robot_node import main as run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
