"""Gymnasium environments as ROS 2 robots (the optional ``gym`` extra): any env id, N copies, one node.

An edge of the package, like :mod:`plugrl_ros.demo` and :mod:`plugrl_ros.tools`:
it may import rclpy and every lower layer, and nothing of the bridge (node,
robot, train, deploy, params, ros) ever imports it, so the bridge runs
without Gymnasium or MuJoCo installed. ``pip install 'plugrl_ros[gym]'``
(or ``requirements/gym.txt``) brings them.
"""
