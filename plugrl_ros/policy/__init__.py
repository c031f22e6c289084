"""Deploy stepping: running a policy server's action chunks on a robot, one step per control tick.

Pure and clock-injected (no ROS, no network), like ``plugrl_ros.rollout``.
"""
