"""The PlugRL wire protocol from the env client's side: codec, messages, connection.

Pure Python with no ROS dependency (layer 1 of docs/design.md).
"""
