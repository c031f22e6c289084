"""ROS 2 adapters: parameters, message converters, and the bridge node (layer 3 of docs/design.md)."""
