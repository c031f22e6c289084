"""plugrl_ros: train ROS 2 robots with a remote PlugRL reinforcement-learning trainer."""

__version__ = "0.1.0"
