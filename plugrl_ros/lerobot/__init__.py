"""The lerobot extra: recordings as LeRobotDataset v3.0 folders (``plugrl-export --to lerobot``), written with
pyarrow and PyAV; LeRobot itself is only the reader."""
