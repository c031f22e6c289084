"""Train mode: the robot side stepped by the PlugRL rollout core, over the trainer link's own thread."""
