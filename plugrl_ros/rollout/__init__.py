"""The rollout core: per-env chunks, rewards, episodes, the multi-env scheduler and timer mode's stepping rule.

Pure Python with no ROS, no network and no wall clock (layer 2 of docs/design.md).
"""
