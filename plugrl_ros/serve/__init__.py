"""The trainer's side of the link, free of any trainer library: the one server every trainer face stands on.

Bridges connect to :class:`~plugrl_ros.serve.bridge_server.BridgeServer`,
whose connections run the package's server-side protocol core and its one
access gate; what it reads becomes events (:mod:`plugrl_ros.serve.events`),
observations are checked against spaces built from the bridge's own params
file (:mod:`plugrl_ros.serve.spaces`), and a chunk is one RL step
(:mod:`plugrl_ros.serve.chunks`). RLlib's EnvRunner (:mod:`plugrl_ros.rllib`)
and the Gymnasium vector env (:mod:`plugrl_ros.vector`) are built on it. It
imports neither Ray nor torch.
"""
