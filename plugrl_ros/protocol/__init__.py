"""The PlugRL wire protocol from the env client's side: codec, messages, connection.

Pure Python with no ROS dependency (DESIGN.md layer 1).
"""
