"""Commands and fixtures shipped with plugrl_ros: the probe, the test trainer, the demo."""
