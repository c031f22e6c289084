"""RLlib trains ROS 2 robots through the bridge: an EnvRunner that serves PlugRL with server-side inference.

The optional ``rllib`` extra (``pip install plugrl_ros[rllib]``); the bridge
never imports it. :class:`PlugRLEnvRunner` is an RLlib EnvRunner (new API
stack) that bridges connect to as their PlugRL trainer;
:func:`robot_spaces` builds its observation and action spaces from the
bridge's own params file; :class:`RunnerSettings` goes into ``env_config``.
See docs/rllib.md.
"""

from plugrl_ros.rllib.env_runner import PlugRLEnvRunner
from plugrl_ros.rllib.settings import RunnerSettings
from plugrl_ros.serve.chunks import ChunkMapping, chunk_gamma
from plugrl_ros.serve.spaces import RobotSpaces, robot_spaces

__all__ = ["ChunkMapping", "PlugRLEnvRunner", "RobotSpaces", "RunnerSettings", "chunk_gamma", "robot_spaces"]
