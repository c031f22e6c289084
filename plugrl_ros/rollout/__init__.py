"""The rollout core: per-env chunks, rewards, episodes and the multi-env scheduler.

Pure Python with no ROS, no network and no wall clock (layer 2 of docs/design.md).
"""
