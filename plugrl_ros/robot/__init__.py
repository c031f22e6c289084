"""The robot side every mode drives: each env's ROS I/O and state, resets, pause and the dead-man switch."""
