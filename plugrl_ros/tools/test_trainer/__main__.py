"""``python -m plugrl_ros.tools.test_trainer``: the same as ``plugrl-test-trainer``."""

import sys

from plugrl_ros.tools.test_trainer.cli import main

sys.exit(main())
