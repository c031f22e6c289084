"""A network the test controls, between the bridge and the trainer: latency, jitter, partitions, loss, rate caps.

Two tools, used by test/test_network.py and bench/bench_network.py:

- :class:`Relay`, a userspace TCP relay on loopback with a delay queue per
  direction. The kernel here has no ``netem`` qdisc, so latency and jitter are
  added in the path instead. A TCP stream is delivered in order whatever the
  packets do, so packet reordering reaches the application only as delay
  variance: the relay draws each chunk's delay around the mean (jitter) and
  never lets a chunk overtake an earlier one on the same stream, which is
  exactly what a reordering network looks like from above TCP. It can also
  partition the link (hold every byte, close nothing) and cut it half-open
  (the trainer's side vanishes, the bridge's side hears nothing, ever).
- :class:`NetnsLink`, two network namespaces of our own joined by a veth pair,
  as root: packet loss and partitions with ``iptables`` DROP rules, rate caps
  with ``tc tbf``. Addresses are link-local and exist only inside those
  namespaces; nothing here touches the host's own network.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import random
import shutil
import subprocess
import threading
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

CLONE_NEWNET = 0x40000000


# -- the relay ----------------------------------------------------------------


@dataclass
class _Direction:
    """One direction of one relayed connection: chunks waiting for their release time."""

    queue: deque = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    last_release: float = 0.0


class Relay:
    """A TCP relay from 127.0.0.1:<port> to ``target`` with a round-trip delay, jitter, partitions and cuts.

    Runs on its own event loop thread. ``rtt_s`` is split evenly between the
    two directions; each chunk's one-way delay is drawn uniformly within
    ``± jitter`` (a fraction) of the mean, and order on a stream is kept.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        rtt_s: float = 0.0,
        jitter: float = 0.0,
        seed: int = 0,
        upstream_netns: str | None = None,
    ):
        """``upstream_netns``: open the connections to ``target`` from that namespace (see :class:`NetnsLink`)."""
        self._target = (target_host, target_port)
        self._upstream_netns = upstream_netns
        self.rtt_s = rtt_s
        self.jitter = jitter
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._open = asyncio.Event()  # set: the link carries traffic
        self._pairs: set[_Pair] = set()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="plugrl-netem-relay", daemon=True)
        self.port = 0
        self.bytes_up = 0  # bridge -> trainer, delivered
        self._writes_down = 0  # most chunks delivered to the bridge on one connection (metadata, then per action)
        self._trainer_closes = 0  # connections the trainer's side closed (seen by the relay, delivered or not)
        self._closes_before_partition = 0
        self._progress = threading.Condition()

    # -- control (any thread) --------------------------------------------------

    def start(self) -> int:
        self._thread.start()
        return self._call(self._start())

    def stop(self) -> None:
        if self._thread.is_alive():
            self._call(self._stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    def partition(self) -> None:
        """Hold every byte in both directions and close nothing: a link that went silent."""
        with self._progress:
            self._closes_before_partition = self._trainer_closes
        self._loop.call_soon_threadsafe(self._open.clear)

    def heal(self) -> None:
        """Deliver what was held and carry traffic again."""
        self._loop.call_soon_threadsafe(self._open.set)

    def cut_half_open(self) -> None:
        """The trainer's side vanishes (its connections are dropped); the bridge's side hears nothing, ever."""
        self._call(self._cut())

    def wait_writes_down(self, n: int, timeout: float) -> bool:
        """Wait until ``n`` chunks have reached the bridge on one connection (about one per trainer message)."""
        with self._progress:
            return self._progress.wait_for(lambda: self._writes_down >= n, timeout)

    def wait_trainer_closed(self, timeout: float) -> bool:
        """Wait until the trainer's side closes a connection after :meth:`partition` (held, not yet delivered)."""
        with self._progress:
            return self._progress.wait_for(lambda: self._trainer_closes > self._closes_before_partition, timeout)

    def _trainer_closed(self) -> None:
        with self._progress:
            self._trainer_closes += 1
            self._progress.notify_all()

    def _delivered_down(self, on_this_connection: int) -> None:
        with self._progress:
            self._writes_down = max(self._writes_down, on_this_connection)
            self._progress.notify_all()

    @property
    def uri(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    # -- the loop ----------------------------------------------------------------

    async def _start(self) -> int:
        self._open.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        if self._upstream_netns is not None:
            # the listener stays on this namespace's loopback; every socket made from now on, on this
            # thread (the relay's connections to the target), is made in the other one
            enter_netns(self._upstream_netns)
        return self.port

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for pair in list(self._pairs):
            pair.close()
        await asyncio.gather(*(p.task for p in self._pairs if p.task), return_exceptions=True)

    async def _cut(self) -> None:
        for pair in list(self._pairs):
            pair.cut()

    async def _accept(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        if not self._open.is_set():
            # partitioned: the connection's first packet is lost, so its handshake hangs until the
            # client gives up; nothing reaches the trainer
            while await down_r.read(65536):
                pass
            down_w.close()
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self._target)
        except OSError:
            down_w.close()
            return
        pair = _Pair(self, down_r, down_w, up_r, up_w)
        self._pairs.add(pair)
        pair.task = asyncio.current_task()
        try:
            await pair.run()
        finally:
            self._pairs.discard(pair)

    def delay(self) -> float:
        one_way = self.rtt_s / 2
        return one_way * self._rng.uniform(1 - self.jitter, 1 + self.jitter) if one_way > 0 else 0.0


class _Pair:
    """One relayed connection: a pump per direction (read -> delay queue -> write)."""

    def __init__(self, relay: Relay, down_r, down_w, up_r, up_w) -> None:
        self.relay = relay
        self.down_r, self.down_w, self.up_r, self.up_w = down_r, down_w, up_r, up_w
        self.task: asyncio.Task | None = None
        self.half_open = False
        self.writes_down = 0
        self._tasks: list[asyncio.Task] = []

    async def run(self) -> None:
        up, down = _Direction(), _Direction()
        self._tasks = [
            asyncio.ensure_future(self._read(self.down_r, up)),
            asyncio.ensure_future(self._write(up, self.up_w, count=True)),
            asyncio.ensure_future(self._read(self.up_r, down, on_eof=self.relay._trainer_closed)),
            asyncio.ensure_future(self._write(down, self.down_w, count=False)),
        ]
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in (self.up_w, self.down_w):
            writer.close()

    async def _read(self, reader: asyncio.StreamReader, direction: _Direction, on_eof=None) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = await reader.read(65536)
            except OSError:
                data = b""
            if self.half_open:
                if not data:
                    return
                continue  # the peer is gone: everything sent into the link is lost
            release = max(loop.time() + self.relay.delay(), direction.last_release)
            direction.last_release = release
            direction.queue.append((release, data))
            direction.wake.set()
            if not data:
                if on_eof is not None:
                    on_eof()
                return

    async def _write(self, direction: _Direction, writer: asyncio.StreamWriter, count: bool) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not direction.queue:
                direction.wake.clear()
                await direction.wake.wait()
            release, data = direction.queue[0]
            if release > loop.time():
                await asyncio.sleep(release - loop.time())  # the modelled propagation delay itself
            await self.relay._open.wait()
            direction.queue.popleft()
            if self.half_open:
                return
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            try:
                await writer.drain()
            except OSError:
                return
            if count:
                self.relay.bytes_up += len(data)
            else:
                self.writes_down += 1
                self.relay._delivered_down(self.writes_down)

    def cut(self) -> None:
        self.half_open = True
        self.up_w.transport.abort()  # the trainer's host is gone; its side learns nothing more either

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()


# -- namespaces -----------------------------------------------------------------


NETNS_PREFIX = "plugrl-net-"


def enter_netns(name: str) -> None:
    """Move the calling thread (and threads it starts later) into network namespace ``name``."""
    libc = ctypes.CDLL(None, use_errno=True)
    target = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into the namespace {name} failed")
    finally:
        os.close(target)


def _our_name(kind: str) -> str:
    """A namespace name no other run can hold: this process's id and a random tag."""
    return f"{NETNS_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-{kind}"


def remove_orphaned_namespaces() -> None:
    """Remove namespaces of ours whose process is gone (a run killed before its cleanup); never a live run's."""
    listed = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True)
    for line in listed.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(NETNS_PREFIX):
            continue
        owner = name[len(NETNS_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def netns_unavailable() -> str | None:
    """Why :class:`NetnsLink` cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, as CI does)"
    for tool in ("ip", "iptables", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: apt-get install iproute2 iptables)"
    remove_orphaned_namespaces()
    probe = _our_name("probe")
    made = subprocess.run(["ip", "netns", "add", probe], check=False, capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        rule = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                probe,
                "iptables",
                "-A",
                "INPUT",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                "0.01",
                "-j",
                "DROP",
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        if rule.returncode != 0:
            return f"iptables cannot add a statistic DROP rule in a namespace: {rule.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)
    return None


def _run(*command: str) -> None:
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


class NetnsLink:
    """Two namespaces (``robot``, ``trainer``) joined by a veth pair: 169.254.77.1 <-> 169.254.77.2.

    The bridge side runs with :meth:`exec_prefix` (``ip netns exec``); a server
    is bound inside the trainer namespace with :meth:`in_trainer_ns`. Loss,
    partitions and caps act on the robot's end of the veth, both directions.
    """

    ROBOT_ADDR = "169.254.77.1"
    TRAINER_ADDR = "169.254.77.2"

    def __init__(self) -> None:
        # namespace names are global: ours carry the process id and a random tag (and an orphan of a
        # killed run is removed by the next); the veth pair lives only inside them, so its names are free
        self.robot = _our_name("r")
        self.trainer = self.robot[:-1] + "t"
        self._veth_r = "plugrl-r"
        self._veth_t = "plugrl-t"

    def __enter__(self) -> NetnsLink:
        try:
            remove_orphaned_namespaces()
            _run("ip", "netns", "add", self.robot)
            _run("ip", "netns", "add", self.trainer)
            _run(
                "ip",
                "-n",
                self.robot,
                "link",
                "add",
                self._veth_r,
                "type",
                "veth",
                "peer",
                "name",
                self._veth_t,
                "netns",
                self.trainer,
            )
            for ns, dev, addr in (
                (self.robot, self._veth_r, self.ROBOT_ADDR),
                (self.trainer, self._veth_t, self.TRAINER_ADDR),
            ):
                _run("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
                _run("ip", "-n", ns, "link", "set", dev, "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove both namespaces (and with them the veth pair and every rule)."""
        for ns in (self.robot, self.trainer):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.robot]

    @contextlib.contextmanager
    def in_trainer_ns(self) -> Iterator[None]:
        """Run the block's thread (and threads it starts) in the trainer's namespace; sockets stay there."""
        libc = ctypes.CDLL(None, use_errno=True)
        home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
        target = os.open(f"/var/run/netns/{self.trainer}", os.O_RDONLY)
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the trainer namespace failed")
            try:
                yield
            finally:
                if libc.setns(home, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back to the test's namespace failed")
        finally:
            os.close(home)
            os.close(target)

    def _iptables(self, *rule: str) -> None:
        _run("ip", "netns", "exec", self.robot, "iptables", *rule)

    def loss(self, probability: float) -> None:
        """Drop each packet in each direction with ``probability`` (on top of what is there)."""
        for chain in ("INPUT", "OUTPUT"):
            self._iptables(
                "-A",
                chain,
                "-o" if chain == "OUTPUT" else "-i",
                self._veth_r,
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                f"{probability}",
                "-j",
                "DROP",
            )

    def partition(self) -> None:
        """Drop every packet both ways; nothing is closed, nobody is told."""
        self._iptables("-I", "INPUT", "-i", self._veth_r, "-j", "DROP")
        self._iptables("-I", "OUTPUT", "-o", self._veth_r, "-j", "DROP")

    def heal(self) -> None:
        self._iptables("-D", "INPUT", "-i", self._veth_r, "-j", "DROP")
        self._iptables("-D", "OUTPUT", "-o", self._veth_r, "-j", "DROP")

    def trainer_connections(self, port: int) -> int:
        """Established TCP connections to ``port`` in the trainer's namespace (as its kernel sees them)."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.trainer, "ss", "-Htn", "state", "established", f"( sport = :{port} )"],
            check=True,
            capture_output=True,
            text=True,
        )
        return len(done.stdout.splitlines())

    def cap(self, rate_mbit: float) -> None:
        """Cap the robot's uplink (robot -> trainer) with a token bucket."""
        _run(
            "ip",
            "netns",
            "exec",
            self.robot,
            "tc",
            "qdisc",
            "add",
            "dev",
            self._veth_r,
            "root",
            "tbf",
            "rate",
            f"{rate_mbit}mbit",
            "burst",
            "32kbit",
            "latency",
            "400ms",
        )
