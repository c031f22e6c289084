"""The bridge node: a composition of parameters, the robot side and a mode; its status and its process."""
