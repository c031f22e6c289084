"""Separate machines on one host: network namespaces with link-local addresses, a Ray node in each, processes torn down.

The layout (every address link-local, 169.254.0.0/16, and only inside
namespaces made here)::

    head 169.254.10.1 ─┐                              (Ray head, the driver and learner)
    site a 169.254.10.11 ─┤ backbone: a Linux bridge   (Ray worker, runner for site a)
    site b 169.254.10.12 ─┘ in namespace "core"        (Ray worker, runner for site b)
    site a 169.254.21.1 ── 169.254.21.2 robots a       (demo reachers and their bridge)
    site b 169.254.22.1 ── 169.254.22.2 robots b

A robots' namespace reaches its site's machine only; a site reaches the head
only over the backbone. Cutting a site off the head takes its backbone link
down (the core's end of the veth): the site and its robots keep talking.
Every process started here runs in one of these namespaces, and
:meth:`Fleet.close` ends every process in them (``ip netns pids``) before it
deletes them: nothing outlives the run, and nothing outside it is touched.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # test/netem.py

from netem import NETNS_PREFIX, remove_orphaned_namespaces

HEAD_ADDR = "169.254.10.1"
RAY_PORT = 6379
RUNNER_PORT = 8000  # every site's runner listens here, on its site's machine (RunnerSettings.site_label)
SITE_RESOURCE = "plugrl_site"  # one unit per site node: one runner per site
SITE_LABEL = "plugrl-site"
OBJECT_STORE_BYTES = 80 * 1024 * 1024
DOMAIN_BASE = int(os.environ.get("PLUGRL_TEST_DOMAIN_BASE", "180"))


@dataclass(frozen=True)
class Site:
    """A robot-side site: its Ray node's machine and its robots' machine."""

    name: str  # "a", "b"
    index: int  # 1, 2

    @property
    def backbone_addr(self) -> str:
        return f"169.254.10.{10 + self.index}"

    @property
    def lan_addr(self) -> str:  # the site machine on its robots' network: the bridges' trainer.uri host
        return f"169.254.{20 + self.index}.1"

    @property
    def robots_addr(self) -> str:
        return f"169.254.{20 + self.index}.2"

    @property
    def uri(self) -> str:
        return f"ws://{self.lan_addr}:{RUNNER_PORT}"


def unavailable() -> str | None:
    """Why the fleet cannot run here (not root, a tool missing), or None."""
    if os.geteuid() != 0:
        return "the fleet needs root: it makes network namespaces and veth pairs (run it as root, as CI does)"
    for tool in ("ip",):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: apt-get install iproute2)"
    return None


def run(*command: str) -> None:
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


@dataclass
class Proc:
    """A process in one namespace, its output in a file; ``lines`` keeps what it printed."""

    name: str
    popen: subprocess.Popen
    log: Path
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None
    changed: threading.Condition = field(default_factory=threading.Condition)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, predicate: Callable[[list[str]], object], timeout: float) -> object:
        """The first true ``predicate(lines)`` within ``timeout`` s (None if it never is, or the process ended)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = predicate(self.lines)
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or (
                    self.popen.poll() is not None and self.reader is not None and not self.reader.is_alive()
                ):
                    return None
                self.changed.wait(min(left, 1.0))


class Fleet:
    """The namespaces, the Ray nodes and every process in them; a context manager that leaves nothing behind."""

    def __init__(self, workdir: Path, sites: list[Site], venv_bin: Path) -> None:
        self.workdir = workdir
        self.sites = sites
        self.venv_bin = venv_bin
        tag = f"{NETNS_PREFIX}{os.getpid()}-fleet"
        self.ns = {"core": f"{tag}-core", "head": f"{tag}-head"}
        for site in sites:
            self.ns[f"site-{site.name}"] = f"{tag}-s{site.name}"
            self.ns[f"robots-{site.name}"] = f"{tag}-r{site.name}"
        self.procs: list[Proc] = []
        self.token_file = workdir / "ray-auth-token"
        self.env: dict[str, str] = {}

    # -- namespaces ------------------------------------------------------------------------

    def __enter__(self) -> Fleet:
        try:
            self._make_network()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make_network(self) -> None:
        remove_orphaned_namespaces()
        for ns in self.ns.values():
            run("ip", "netns", "add", ns)
            run("ip", "-n", ns, "link", "set", "lo", "up")
        core = self.ns["core"]
        run("ip", "-n", core, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", core, "link", "set", "br0", "up")
        backbone = [("head", HEAD_ADDR)] + [(f"site-{s.name}", s.backbone_addr) for s in self.sites]
        for node, addr in backbone:
            port = f"p-{node}"[:15]
            run("ip", "-n", core, "link", "add", port, "type", "veth", "peer", "name", "bb0", "netns", self.ns[node])
            run("ip", "-n", core, "link", "set", port, "master", "br0")
            run("ip", "-n", core, "link", "set", port, "up")
            run("ip", "-n", self.ns[node], "addr", "add", f"{addr}/24", "dev", "bb0")
            run("ip", "-n", self.ns[node], "link", "set", "bb0", "up")
        for site in self.sites:
            site_ns, robots_ns = self.ns[f"site-{site.name}"], self.ns[f"robots-{site.name}"]
            run("ip", "-n", site_ns, "link", "add", "lan0", "type", "veth", "peer", "name", "lan0", "netns", robots_ns)
            run("ip", "-n", site_ns, "addr", "add", f"{site.lan_addr}/24", "dev", "lan0")
            run("ip", "-n", robots_ns, "addr", "add", f"{site.robots_addr}/24", "dev", "lan0")
            run("ip", "-n", site_ns, "link", "set", "lan0", "up")
            run("ip", "-n", robots_ns, "link", "set", "lan0", "up")
        # Ray's token authentication: the same token on every node and in every driver, in a file only
        # root can read (never in a command line or a log)
        self.token_file.write_text(secrets.token_hex(32))
        self.token_file.chmod(0o600)

    def cut(self, site: Site) -> None:
        """Take the site's backbone link down at the core's end: the site and the head hear nothing of each other."""
        run("ip", "-n", self.ns["core"], "link", "set", f"p-site-{site.name}"[:15], "down")

    def heal(self, site: Site) -> None:
        run("ip", "-n", self.ns["core"], "link", "set", f"p-site-{site.name}"[:15], "up")

    def backbone_bytes(self, node: str) -> tuple[int, int]:
        """(received, sent) bytes on ``node``'s backbone interface."""
        stats = "/sys/class/net/bb0/statistics"
        done = subprocess.run(
            ["ip", "netns", "exec", self.ns[node], "cat", f"{stats}/rx_bytes", f"{stats}/tx_bytes"],
            check=True,
            capture_output=True,
            text=True,
        )
        rx, tx = (int(v) for v in done.stdout.split())
        return rx, tx

    def pids(self, node: str) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", self.ns[node]], check=False, capture_output=True, text=True)
        return [int(p) for p in done.stdout.split()]

    # -- processes -------------------------------------------------------------------------

    def base_env(self, node: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        env.update(
            {
                "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": "1",
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": str(self.token_file),
                "RAY_USAGE_STATS_ENABLED": "0",
                # a site may lose its uplink for longer than Ray's default 15 s of missed health checks
                # (5 x 3 s) before the head declares its node dead: 60 s here (see docs/rllib.md)
                "RAY_health_check_failure_threshold": "20",
                # and its gRPC connections must outlive the cut: with Ray's default keepalive (a ping every
                # 10 s, 20 s to answer) the actor's side drops the driver's connection during a 30 s cut, and
                # the sample call under way fails when the link is back (RLlib drops its steps)
                "RAY_grpc_keepalive_timeout_ms": "60000",
                "RAY_grpc_client_keepalive_timeout_ms": "60000",
                # each machine its own ROS domain (they are separate networks anyway)
                "ROS_DOMAIN_ID": str(DOMAIN_BASE + sorted(self.ns).index(node) % 10),
                "PATH": f"{self.venv_bin}:{os.environ.get('PATH', '')}",
            }
        )
        return env

    def start(self, node: str, name: str, command: list[str], env: dict[str, str] | None = None) -> Proc:
        """Start ``command`` in ``node``'s namespace (a session of its own), its output to ``name``.log."""
        log = self.workdir / f"{name}.log"
        popen = subprocess.Popen(
            ["ip", "netns", "exec", self.ns[node], *command],
            env=env or self.base_env(node),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        proc = Proc(name, popen, log)
        proc.reader = threading.Thread(target=self._read, args=(proc,), name=f"fleet-read-{name}", daemon=True)
        proc.reader.start()
        self.procs.append(proc)
        return proc

    @staticmethod
    def _read(proc: Proc) -> None:
        assert proc.popen.stdout is not None
        with proc.log.open("a") as out:
            for line in proc.popen.stdout:
                out.write(line)
                out.flush()
                with proc.changed:
                    proc.lines.append(line.rstrip("\n"))
                    proc.changed.notify_all()
        with proc.changed:
            proc.changed.notify_all()

    def start_ray(self, node: str, site: Site | None = None) -> Proc:
        """``ray start --block`` in ``node``'s namespace: the head, or a site's worker node (label, resource)."""
        temp = self.workdir / f"ray-{node}"
        command = [
            str(self.venv_bin / "ray"),
            "start",
            "--block",
            "--disable-usage-stats",
            f"--temp-dir={temp}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
        ]
        if site is None:
            command += [
                "--head",
                f"--node-ip-address={HEAD_ADDR}",
                f"--port={RAY_PORT}",
                "--num-cpus=0",  # the driver's learner runs in the driver; nothing else belongs here
                "--include-dashboard=false",
            ]
        else:
            command += [
                f"--address={HEAD_ADDR}:{RAY_PORT}",
                f"--node-ip-address={site.backbone_addr}",
                "--num-cpus=1",
                f"--resources={json.dumps({SITE_RESOURCE: 1})}",
                f"--labels={SITE_LABEL}={site.name}",
            ]
        return self.start(node, f"ray-{node}", command)

    def stop(self, proc: Proc, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Signal the process's group; SIGKILL it after ``timeout``."""
        if proc.popen.poll() is None:
            try:
                os.killpg(proc.popen.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(10)
        return proc.popen.returncode

    def end_namespace(self, node: str, timeout: float = 20.0) -> None:
        """End every process in ``node``'s namespace: SIGTERM, then SIGKILL what is left after ``timeout``."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.pids(node)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 10.0)
            while self.pids(node) and time.monotonic() < deadline:
                time.sleep(0.2)  # polling the kernel's list of the namespace's processes: nothing to block on
            if not self.pids(node):
                return

    def close(self) -> None:
        """End every process of every namespace, then delete the namespaces (with every veth and the bridge)."""
        for node in self.ns:
            if node != "core":
                self.end_namespace(node, timeout=15.0)
        for proc in self.procs:
            if proc.popen.poll() is None:
                self.stop(proc, signal.SIGKILL, 5.0)
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
