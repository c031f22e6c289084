"""The openpi-compatible policy-server contract, client side: a sans-I/O session and an asyncio client.

Pure Python with no ROS dependency, like the rest of the protocol layer.
"""
