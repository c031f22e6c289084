"""ROS 2 adapters: parameters, message converters, and the bridge node (DESIGN.md layer 3)."""
