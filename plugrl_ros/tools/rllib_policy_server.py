"""``plugrl-policy-server``'s light entry point: without the rllib extra it says how to install it, else it serves.

The executables import their module before anything else runs (plugrl_ros.executables),
and the server's modules import Ray and torch: without the extra that would be an
ImportError's traceback, not a sentence a user can act on.
"""

from __future__ import annotations

import sys

INSTALL = (
    "install the rllib extra: pip install 'plugrl_ros[rllib]' (Ray RLlib and torch), "
    'or in a checkout scripts/setup-venv.sh .venv kilted "" rllib'
)


def missing() -> str | None:
    """Why Ray RLlib cannot be imported (the ImportError's text), or None if it can."""
    try:
        import ray.rllib  # noqa: F401
    except ImportError as exc:
        return str(exc) or "ray[rllib] is not installed"
    return None


def main(args: list[str] | None = None) -> int:
    problem = missing()
    if problem is not None:
        print(f"plugrl-policy-server: needs Ray RLlib ({problem}); {INSTALL}", file=sys.stderr)
        return 2
    from plugrl_ros.rllib.policy_server import main as run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
