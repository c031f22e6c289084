"""Deploy mode: the robot side stepped by a policy server's action chunks, one connection per robot."""
