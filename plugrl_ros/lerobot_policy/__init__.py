"""LeRobot policies served to the bridge: ``plugrl-policy-server --lerobot`` (the lerobot-policy extra)."""
