"""The demo: a simulated ROS 2 reacher, the bridge and a small local PlugRL trainer that learns to reach."""
