"""Which robots' site a runner serves: its Ray node's site label, so that its address is the site's, not its index's.

A fleet runs one runner per robot-side Ray node. RLlib numbers runners
(``worker_index``) in the order it creates them, and Ray places and restarts
them wherever the requested resources are free, so an index says nothing about
the machine a runner is on. The node does: an operator starts each robot-side
node with a label naming its site (``ray start --labels plugrl-site=A``) and one
unit of a resource that only runners ask for (``--resources '{"plugrl_site": 1}'``,
with ``custom_resources_per_env_runner={"plugrl_site": 1}``: at most one
runner per site node). A runner with ``RunnerSettings(site_label=...)`` reads
the label of the node it was placed on and listens on the fixed ``port`` there,
so a bridge's ``trainer.uri`` is ``ws://<site node>:<port>`` for as long as the
site exists, whichever runner index serves it and however often Ray restarts it.
"""

from __future__ import annotations

import ray


def node_site(label: str) -> str:
    """The value of Ray node label ``label`` on the node this process runs on (ValueError naming the fix if absent)."""
    context = ray.get_runtime_context()
    labels = context.get_node_labels()
    site = labels.get(label)
    if isinstance(site, list):  # get_node_labels() is annotated as lists of values; Ray 2.60 gives strings
        site = site[0] if site else None
    if not site:
        raise ValueError(
            f'PlugRL runner: env_config["plugrl"]["site_label"] is {label!r}, but the Ray node it was placed on '
            f"({context.get_node_id()}) has no such label (its labels: {sorted(labels) or 'none'}). Start each "
            f"robot-side node with `ray start --labels {label}=<site> --resources '{{\"<resource>\": 1}}'` and "
            "ask for that resource with env_runners(custom_resources_per_env_runner={<resource>: 1}), so that "
            "runners are placed only on site nodes, one per node"
        )
    return str(site)
