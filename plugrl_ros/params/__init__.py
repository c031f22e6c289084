"""The bridge's parameters without ROS.

Every key's declaration, typed sections with their checks, the policy section,
and rcl's command-line refusals turned into errors naming the key.
"""
