"""``python -m plugrl_ros.demo``: the same as ``plugrl-demo``."""

import sys

from plugrl_ros.demo.runner import main

sys.exit(main())
