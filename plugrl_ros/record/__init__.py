"""Recording: every transition of a run as MCAP, written off the control thread, and tools to read it back."""
