"""Gymnasium trainers train ROS 2 robots: the robots behind the bridges as one vector env that serves PlugRL.

``RobotVectorEnv.from_params("robot.yaml", num_envs=2, ...)`` listens for
bridges (API key and TLS like every server of the package) and is a
``gymnasium.vector.VectorEnv`` of the robots. It imports no Ray and no torch;
Stable-Baselines3's own ``VecEnv`` API is in :mod:`plugrl_ros.sb3`. See
docs/gymnasium-trainers.md.
"""

from plugrl_ros.serve.spaces import RobotSpaces, robot_spaces
from plugrl_ros.vector.env import RobotVectorEnv, VectorSettings
from plugrl_ros.vector.slots import RobotsMissing

__all__ = ["RobotSpaces", "RobotVectorEnv", "RobotsMissing", "VectorSettings", "robot_spaces"]
