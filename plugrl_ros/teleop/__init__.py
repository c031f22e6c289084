"""Teleop mode: a person drives the robots, recorded as demonstrations."""
