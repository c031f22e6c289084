"""CI's compatibility passes select tests by mark; a test module that touches ROS cannot escape the Jazzy pass.

``.ci/run`` runs the whole suite once, then only the ``ros`` tests with the ROS 2
Jazzy wheels and only the ``websockets`` tests with the oldest websockets. A test
that opens a websocket without its mark fails at once (conftest's
``_websocket_tests_are_marked``); this module does the same for ROS, from the
imports: a test module that reaches rclpy or a ROS interface package, directly or
through plugrl_ros, must carry the ``ros`` mark.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from harness import ROOT

_ROS = re.compile(r"(rclpy|launch|launch_ros|ament_index_python|rosidl\w*|\w+_(msgs|srvs|interfaces))(\.|$)")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _ros_modules() -> set[str]:
    """plugrl_ros modules that import ROS, directly or through other plugrl_ros modules."""
    graph = {}
    for path in (ROOT / "plugrl_ros").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        graph[name] = _imports(path)
    tainted = {name for name, imports in graph.items() if any(_ROS.match(i) for i in imports)}
    while True:
        more = {name for name, imports in graph.items() if name not in tainted and imports & tainted}
        if not more:
            return tainted
        tainted |= more


def _touches_ros(path: Path, ros_modules: set[str]) -> bool:
    return any(_ROS.match(name) or name in ros_modules for name in _imports(path))


def test_every_test_module_that_touches_ros_carries_the_ros_mark():
    ros_modules = _ros_modules()
    assert "plugrl_ros.node.bridge_node" in ros_modules and "plugrl_ros.protocol.codec" not in ros_modules
    unmarked = [
        path.name
        for path in sorted((ROOT / "test").glob("test_*.py"))
        if _touches_ros(path, ros_modules) and "pytest.mark.ros" not in path.read_text()
    ]
    assert not unmarked, f"these reach ROS but the Jazzy pass would skip them; mark them ros: {unmarked}"


@pytest.mark.parametrize("mark", ["ros", "websockets"])
def test_each_compatibility_pass_selects_by_a_registered_mark(mark):
    assert re.search(rf'(?m)^  "{mark}: ', (ROOT / "pyproject.toml").read_text())
    assert re.search(rf"(?m)^run_matrix_entry .* {mark}$", (ROOT / ".ci" / "run").read_text())
