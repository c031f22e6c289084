"""Stable-Baselines3 trains ROS 2 robots through the bridge: its ``VecEnv`` over the robots, its models served.

The optional ``sb3`` extra (``pip install 'plugrl_ros[sb3]'``); the bridge never
imports it. :class:`RobotVecEnv` is an SB3 ``VecEnv`` that serves PlugRL to
the bridges (:mod:`plugrl_ros.vector`); ``plugrl-policy-server --sb3 MODEL.zip``
serves a trained model to bridges in deploy mode. See docs/gymnasium-trainers.md.
"""

from plugrl_ros.sb3.vec_env import RobotVecEnv

__all__ = ["RobotVecEnv"]
