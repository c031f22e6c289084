"""The fleet harness: a Ray cluster of separate machines on one host trains robots, survives failures, is measured.

    python test/fleet/run.py [--quick] [--out DIR]        (as root; scripts/fleet.sh runs it)

Brings up the namespaces of :mod:`cluster` (a head, two robot-side sites, each
site's robots), ``ray start`` in each with token authentication, the demo
reachers and a bridge per site pointed at the site's fixed address, and the
head's driver (:mod:`driver`). Then, each bounded in time:

- scale: one site training alone, then both (unless ``--quick``);
- the failure scenarios: a runner process killed, a site's Ray node stopped and
  started again, a site cut off the head for 30 s, the driver killed and
  restarted from its last checkpoint.

It prints a table of the scenarios (pass/fail, time to recover, env steps
lost) and the scale figures, writes them to ``DIR/fleet.json``, and exits 0
only if every scenario passed. Every process runs in a namespace of the run
and is ended with it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import HEAD_ADDR, RAY_PORT, SITE_LABEL, SITE_RESOURCE, Fleet, Proc, Site, unavailable  # noqa: E402

ROOT = HERE.parents[1]
DEMO = ROOT / "config" / "demo.yaml"
ROBOTS_PER_SITE = 2
STEPS = re.compile(r"\| (\d+) steps, \d+ episodes")
CONNECTED = re.compile(r"connected to the trainer at \S+ \(connection (\d+)\)")
DROPPED = re.compile(r"dropped the chunks of env\(s\) \[([\d, ]*)\]")
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+")
CUT_S = 30.0
RECOVERY_BOUND_S = 180.0
ATTEMPTS = 5  # ray start on a loaded host: a raylet has 30 s to register with the head (Ray's, fixed)


@dataclass
class Outcome:
    name: str
    passed: bool = False
    recover_s: float | None = None
    steps_lost: int | None = None
    detail: str = ""
    bridge_log: list[str] = field(default_factory=list)
    runner_log: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Balance:
    """Robot steps taken, learner steps received, steps the protocol dropped on closes: at a quiet moment."""

    robot: int
    learner: int
    dropped: int
    per_site: dict


class Harness:
    def __init__(self, out: Path, quick: bool) -> None:
        self.out = out
        self.quick = quick
        self.sites = [Site("a", 1), Site("b", 2)]
        venv_bin = Path(sys.executable).parent
        self.fleet = Fleet(out, self.sites, venv_bin)
        self.fleet.env = {"PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.ray: dict[str, Proc] = {}
        self.robots: dict[str, Proc] = {}
        self.bridges: dict[str, Proc] = {}
        self.driver: Proc | None = None
        self.drivers = 0
        self.checkpoint = out / "checkpoint"

    # -- bring-up ---------------------------------------------------------------------------

    def start_head(self) -> None:
        self.ray["head"] = self.fleet.start_ray("head")
        self._wait_ray(self.ray["head"], "head")

    def start_site(self, site: Site) -> None:
        node = f"site-{site.name}"
        for attempt in range(1, ATTEMPTS + 1):
            self.ray[node] = self.fleet.start_ray(node, site)
            try:
                self._wait_ray(self.ray[node], node)
                return
            except RuntimeError:
                # `ray start` gives a raylet 30 s to register with the head; on a loaded host it may miss
                # that: clear the namespace and start again (the site rejoins as a new node)
                if attempt == ATTEMPTS:
                    raise
                print(f"[fleet] ray start in {node} failed (attempt {attempt}); starting it again")
                self.fleet.end_namespace(node)

    @staticmethod
    def _wait_ray(proc: Proc, node: str) -> None:
        if not proc.wait_for(lambda lines: any("block forever" in line for line in lines), 120):
            raise RuntimeError(f"ray start in {node} did not come up:\n" + "\n".join(proc.lines[-12:]))

    def start_robots(self, site: Site) -> None:
        node = f"robots-{site.name}"
        python = sys.executable
        self.robots[site.name] = self.fleet.start(
            node,
            f"robot-{site.name}",
            [python, "-m", "plugrl_ros.demo.robot_node", "--envs", str(ROBOTS_PER_SITE), "--image-size", "16"],
        )
        envs = [f"reacher{i}" for i in range(ROBOTS_PER_SITE)]
        self.bridges[site.name] = self.fleet.start(
            node,
            f"bridge-{site.name}",
            [
                python,
                "-m",
                "plugrl_ros.node.bridge_main",
                *("--ros-args", "-r", f"__node:=bridge_{site.name}", "--params-file", str(DEMO)),
                *("-p", f"trainer.uri:={site.uri}", "-p", f"envs:={envs!r}"),
                *("-p", "trainer.reconnect_max_s:=2.0", "-p", "status.log_period_s:=1.0"),
                *("-p", "trainer.wait_for_next_run:=true"),
            ],
        )

    def start_driver(self, sites: int, restore: bool = False) -> Proc:
        self.drivers += 1
        command = [sys.executable, str(HERE / "driver.py"), "--address", f"{HEAD_ADDR}:{RAY_PORT}"]
        command += ["--sites", str(sites), "--checkpoint", str(self.checkpoint)]
        command += ["--site-label", SITE_LABEL, "--site-resource", SITE_RESOURCE]
        if restore:
            command.append("--restore")
        self.driver = self.fleet.start("head", f"driver-{self.drivers}", command)
        return self.driver

    # -- reading what the processes said ------------------------------------------------------

    def driver_lines(self, kind: str = "iteration", driver: Proc | None = None) -> list[dict]:
        driver = driver or self.driver
        assert driver is not None
        found = []
        for line in list(driver.lines):
            if line.startswith("{"):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if kind in record:
                    found.append(record)
        return found

    def wait_iterations(self, count: int, timeout: float, **where) -> dict | None:
        """The ``count``-th iteration line from now (matching ``where``), within ``timeout`` s."""
        assert self.driver is not None
        seen = len(self.driver_lines())

        def enough(_lines):
            fresh = [r for r in self.driver_lines()[seen:] if all(r.get(k) == v for k, v in where.items())]
            return fresh[count - 1] if len(fresh) >= count else None

        return self.driver.wait_for(enough, timeout)  # type: ignore[return-value]

    def robot_steps(self, site: str, since: int = 0) -> int | None:
        """The bridge's last status line's step count (lines from index ``since``)."""
        for line in reversed(self.bridges[site].lines[since:]):
            found = STEPS.search(line)
            if found:
                return int(found.group(1))
        return None

    def connections(self, site: str) -> int:
        found = [int(m.group(1)) for line in self.bridges[site].lines if (m := CONNECTED.search(line))]
        return max(found, default=0)

    def dropped(self, site: str) -> int:
        return sum(
            len([e for e in m.group(1).split(",") if e.strip()])
            for line in self.bridges[site].lines
            if (m := DROPPED.search(line))
        )

    def wait_stepping(self, site: str, beyond: int, timeout: float, since: int = 0) -> float | None:
        """When the site's robots have stepped past ``beyond`` (a status line after index ``since``), or None."""
        bridge = self.bridges[site]

        def stepped(lines):
            for line in lines[since:]:
                found = STEPS.search(line)
                if found and int(found.group(1)) > beyond:
                    return True
            return False

        return time.monotonic() if bridge.wait_for(stepped, timeout) else None

    def balance(self) -> Balance:
        """Hold the driver between iterations (robots wait, every step they took is with the learner), then count."""
        assert self.driver is not None and self.driver.popen.stdin is not None
        held_before = len(self.driver_lines("held"))
        self.driver.popen.stdin.write("hold\n")
        self.driver.popen.stdin.flush()
        held = self.driver.wait_for(lambda _l: len(self.driver_lines("held")) > held_before, 240)
        if not held:
            raise RuntimeError("the driver did not hold between iterations within 240 s")
        learner = self.driver_lines("held")[-1]["held"]
        # two fresh status lines from every bridge: counted after the robots stopped stepping
        marks = {name: len(bridge.lines) for name, bridge in self.bridges.items()}
        for name, bridge in self.bridges.items():
            bridge.wait_for(lambda lines, n=marks[name]: sum(1 for x in lines[n:] if STEPS.search(x)) >= 2, 10)
        per_site = {name: self.robot_steps(name) or 0 for name in self.bridges}
        self.driver.popen.stdin.write("go\n")
        self.driver.popen.stdin.flush()
        dropped = sum(self.dropped(name) for name in self.bridges)
        return Balance(sum(per_site.values()), learner, dropped, per_site)

    def bridge_excerpt(self, site: str, since: int) -> list[str]:
        keep = ("closed", "connected to the trainer", "cannot reach", "no answer", "stopping", "ERROR")
        lines = [line for line in self.bridges[site].lines[since:] if any(k in line for k in keep)]
        return [re.sub(r"^\[\w+\] \[[\d.]+\] ", "", line)[:200] for line in lines[:8]]

    def runner_excerpt(self, node: str, since: float) -> list[str]:
        """What the runners and the raylet on ``node`` logged since ``since`` (wall clock) about runners' lives."""
        logs = self.out / f"ray-{node}"
        found: list[tuple[str, str]] = []
        for pattern, keep in (
            ("session_2*/logs/worker-*.err", ("PlugRL runner", "Traceback", "Error:")),
            ("session_2*/logs/raylet.out", ("Killing", "owner died", "dead")),
        ):
            for path in sorted(logs.glob(pattern)):
                if path.stat().st_mtime < since:
                    continue
                for line in path.read_text(errors="replace").splitlines():
                    if any(k in line for k in keep):
                        stamp = STAMP.search(line)
                        text = f"{path.name.split('-')[0]}: {line.strip()[:200]}"
                        found.append((stamp.group(0) if stamp else "", text))
        return [text for _, text in sorted(found)][-8:]

    def live_sites(self) -> list[str]:
        """The sites whose runner the driver last reported healthy."""
        return sorted({r[1] for r in self.driver_lines()[-1]["runners"]})

    def runner_pid(self, site: Site) -> int | None:
        for pid in self.fleet.pids(f"site-{site.name}"):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "PlugRLEnvRunner" in cmdline:
                return pid
        return None

    # -- scale --------------------------------------------------------------------------------

    def cpu_by_component(self) -> dict[str, float]:
        """CPU seconds so far of every live process in the run's namespaces, by component."""
        tick = os.sysconf("SC_CLK_TCK")
        totals: dict[str, float] = {}
        for node in self.fleet.ns:
            if node == "core":
                continue
            for pid in self.fleet.pids(node):
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                fields = stat[stat.rindex(")") + 2 :].split()
                seconds = (int(fields[11]) + int(fields[12])) / tick
                key = f"{node.split('-')[0]}: {component(cmdline)}"
                totals[key] = totals.get(key, 0.0) + seconds
        return totals

    def measure(self, label: str, sites: int, window_s: float) -> dict:
        """Train for ``window_s`` after the first iteration; steps/s, updates/min, CPU per step, backbone bytes."""
        first = self.wait_iterations(1, 300)
        if first is None:
            raise RuntimeError(f"{label}: no iteration within 300 s\n" + "\n".join(self.driver.lines[-30:]))
        cpu0, bytes0, t0 = self.cpu_by_component(), self.fleet.backbone_bytes("head"), time.monotonic()
        start = self.driver_lines()[-1]
        deadline = t0 + window_s
        while time.monotonic() < deadline:
            self.wait_iterations(1, max(1.0, deadline - time.monotonic()))
        end = self.driver_lines()[-1]
        cpu1, bytes1, t1 = self.cpu_by_component(), self.fleet.backbone_bytes("head"), time.monotonic()
        iterations = end["iteration"] - start["iteration"]
        steps = end["lifetime"] - start["lifetime"]
        elapsed = end["t"] - start["t"]
        cpu = {k: cpu1.get(k, 0.0) - cpu0.get(k, 0.0) for k in cpu1}
        rx, tx = bytes1[0] - bytes0[0], bytes1[1] - bytes0[1]
        return {
            "label": label,
            "sites": sites,
            "robots": sites * ROBOTS_PER_SITE,
            "iterations": iterations,
            "env_steps": steps,
            "env_steps_per_s": steps / elapsed if elapsed > 0 else 0.0,
            "updates_per_min": 60 * iterations / elapsed if elapsed > 0 else 0.0,
            "cpu_ms_per_step": {k: round(1000 * v / max(steps, 1), 3) for k, v in sorted(cpu.items()) if v > 0.005},
            "cpu_share_of_host": sum(cpu.values()) / max(t1 - t0, 1e-9) / (os.cpu_count() or 1),
            "head_tx_bytes_per_iteration": tx / max(iterations, 1),
            "head_rx_bytes_per_step": rx / max(steps, 1),
            "weights_bytes": (self.driver_lines("built") or [{}])[-1].get("weights_bytes"),
            "sync_weights_s": end.get("sync_s"),
            "learn_s": end.get("learn_s"),
        }

    # -- the scenarios --------------------------------------------------------------------------

    def runner_killed(self) -> Outcome:
        site = self.sites[0]
        outcome = Outcome("runner process killed (site a)")
        whole = self.driver_lines()[-1]["healthy"]  # runners up before (an earlier scenario may have left one down)
        before = self.balance()
        pid = self.runner_pid(site)
        if pid is None:
            outcome.detail = "no runner process found on site a"
            return outcome
        mark, connections, steps = len(self.bridges["a"].lines), self.connections("a"), self.robot_steps("a") or 0
        wall = time.time()
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        reconnected = self.bridges["a"].wait_for(lambda _l: self.connections("a") > connections, RECOVERY_BOUND_S)
        stepping = reconnected and self.wait_stepping("a", steps, RECOVERY_BOUND_S, since=mark)
        healthy = self.wait_iterations(1, RECOVERY_BOUND_S, healthy=whole) if stepping else None
        after = self.balance() if healthy else None
        outcome.recover_s = (stepping - killed) if stepping else None
        runners = healthy["runners"] if healthy else []
        same_address = any(r[1] == "a" and r[2] == 8000 for r in runners)
        new_pid = self.runner_pid(site)
        outcome.passed = bool(healthy) and same_address and new_pid not in (None, pid)
        if after is not None:
            outcome.steps_lost = (after.robot - after.learner) - (before.robot - before.learner)
        outcome.detail = (
            f"killed pid {pid}; Ray restarted it as pid {new_pid}; runners after: {runners}; "
            f"bridge a reconnected: {bool(reconnected)}; restarts counted by RLlib: "
            f"{healthy['restarts'] if healthy else '-'}"
        )
        outcome.bridge_log = self.bridge_excerpt("a", mark)
        outcome.runner_log = self.runner_excerpt("site-a", wall)
        return outcome

    def site_restarted(self) -> Outcome:
        site = self.sites[1]
        outcome = Outcome("site b's Ray node stopped, started again")
        before = self.balance()
        mark, connections = len(self.bridges["b"].lines), self.connections("b")
        wall = time.time()
        self.fleet.end_namespace("site-b")
        self.fleet.stop(self.ray["site-b"], signal.SIGKILL, 5.0)
        stopped = time.monotonic()
        steps_b = self.robot_steps("b") or 0
        a_before = self.robot_steps("a") or 0
        # the site is down for a while: the other site keeps training, this one's robots are held
        during = self.wait_iterations(2, 120, healthy=1)
        held_b = self.robot_steps("b", since=len(self.bridges["b"].lines) - 3) or steps_b
        a_during = self.robot_steps("a") or 0
        self.start_site(site)
        restarted = time.monotonic()
        reconnected = self.bridges["b"].wait_for(lambda _l: self.connections("b") > connections, RECOVERY_BOUND_S)
        stepping = reconnected and self.wait_stepping("b", held_b, RECOVERY_BOUND_S, since=mark)
        healthy = self.wait_iterations(1, RECOVERY_BOUND_S, healthy=2) if stepping else None
        after = self.balance() if healthy else None
        outcome.recover_s = (stepping - restarted) if stepping else None
        outcome.passed = bool(during) and held_b <= steps_b + ROBOTS_PER_SITE and a_during > a_before and bool(healthy)
        if after is not None:
            outcome.steps_lost = (after.robot - after.learner) - (before.robot - before.learner)
        outcome.detail = (
            f"site b down {restarted - stopped:.0f} s: {2 if during else 'no'} iterations trained on site a alone "
            f"(its robots {a_before} -> {a_during} steps); site b's robots held at "
            f"{steps_b} -> {held_b} steps; after the rejoin: runners {healthy['runners'] if healthy else '-'}"
        )
        outcome.bridge_log = self.bridge_excerpt("b", mark)
        outcome.runner_log = self.runner_excerpt("site-b", wall)
        return outcome

    def site_cut(self) -> Outcome:
        site = self.sites[0]
        outcome = Outcome(f"site a cut off the head for {CUT_S:g} s")
        whole = self.driver_lines()[-1]["healthy"]
        before = self.balance()
        mark, steps = len(self.bridges["a"].lines), self.robot_steps("a") or 0
        wall = time.time()
        self.fleet.cut(site)
        cut = time.monotonic()
        time.sleep(CUT_S)  # the scenario is a cut of this length; nothing to wait for
        self.fleet.heal(site)
        healed = time.monotonic()
        stepping = self.wait_stepping("a", self.robot_steps("a") or steps, RECOVERY_BOUND_S)
        healthy = self.wait_iterations(1, RECOVERY_BOUND_S, healthy=whole) if stepping else None
        after = self.balance() if healthy else None
        outcome.recover_s = (stepping - healed) if stepping else None
        dropped = (after.dropped - before.dropped) if after else None
        if after is not None:
            # steps the robots took that never reached the learner (negative: reached it twice); a close
            # may drop at most the step of each robot it lists
            outcome.steps_lost = (after.robot - after.learner) - (before.robot - before.learner)
        outcome.passed = bool(healthy) and outcome.steps_lost is not None and 0 <= outcome.steps_lost <= (dropped or 0)
        outcome.detail = (
            f"cut {healed - cut:.0f} s; after healing, runners {healthy['runners'] if healthy else '-'}; "
            f"robot steps {before.robot} -> {after.robot if after else '-'}, learner {before.learner} -> "
            f"{after.learner if after else '-'}, dropped by the protocol on closes: {dropped}"
        )
        outcome.bridge_log = self.bridge_excerpt("a", mark)
        outcome.runner_log = self.runner_excerpt("site-a", wall)
        return outcome

    def driver_restarted(self) -> Outcome:
        outcome = Outcome("driver killed, restarted from its checkpoint")
        whole = self.driver_lines()[-1]["healthy"]
        before = self.balance()
        saved = [r for r in self.driver_lines() if "checkpoint" in r]
        if not saved:
            self.wait_iterations(2, 240)
            saved = [r for r in self.driver_lines() if "checkpoint" in r]
        last = self.driver_lines()[-1]
        checkpoint = saved[-1] if saved else None
        marks = {name: len(b.lines) for name, b in self.bridges.items()}
        steps = {name: self.robot_steps(name) or 0 for name in self.bridges}
        wall = time.time()
        old = self.driver
        assert old is not None
        self.fleet.stop(old, signal.SIGKILL, 5.0)
        killed = time.monotonic()
        self.start_driver(2, restore=True)
        built = self.driver.wait_for(lambda _l: self.driver_lines("built"), 300)
        first = self.wait_iterations(1, 300) if built else None
        stepping = [self.wait_stepping(n, steps[n], RECOVERY_BOUND_S, since=marks[n]) for n in self.live_sites()]
        after = self.balance() if first else None
        recovered = max((s for s in stepping if s), default=None) if all(stepping) else None
        outcome.recover_s = (recovered - killed) if recovered else None
        if after is not None:
            outcome.steps_lost = (after.robot - after.learner) - (before.robot - before.learner)
        resumed = bool(first) and checkpoint is not None and first["iteration"] == checkpoint["checkpoint"] + 1
        outcome.passed = resumed and bool(first) and first["healthy"] == whole and all(stepping)
        outcome.detail = (
            f"killed at iteration {last['iteration']} (learner {last['lifetime']} steps); last checkpoint: iteration "
            f"{checkpoint['checkpoint'] if checkpoint else '-'} "
            f"({checkpoint['lifetime'] if checkpoint else '-'} steps); "
            f"restored driver built in {built[0]['built'] if built else '-'} s, first iteration "
            f"{first['iteration'] if first else '-'} ({first['lifetime'] if first else '-'} steps), runners "
            f"{first['runners'] if first else '-'}"
        )
        for name in self.bridges:
            outcome.bridge_log += [f"[{name}] {line}" for line in self.bridge_excerpt(name, marks[name])[:4]]
        outcome.runner_log = self.runner_excerpt("site-a", wall)[-4:] + self.runner_excerpt("site-b", wall)[-4:]
        return outcome

    # -- the run --------------------------------------------------------------------------------

    def auth_refused(self) -> Outcome:
        """A driver without the cluster's token is refused (Ray's token authentication is on)."""
        outcome = Outcome("a driver without the token is refused")
        env = self.fleet.base_env("head")
        env["RAY_AUTH_TOKEN_PATH"] = str(self.out / "wrong-token")
        (self.out / "wrong-token").write_text("0" * 64)
        probe = f"import ray; ray.init(address='{HEAD_ADDR}:{RAY_PORT}'); print('CONNECTED')"
        proc = self.fleet.start("head", "auth-probe", [sys.executable, "-c", probe], env=env)
        try:
            proc.popen.wait(90)
        except Exception:
            self.fleet.stop(proc, signal.SIGKILL)
        proc.wait_for(lambda _l: proc.reader is not None and not proc.reader.is_alive(), 5)
        text = "\n".join(proc.lines)
        outcome.passed = "CONNECTED" not in text and proc.popen.returncode != 0
        outcome.detail = next((line for line in proc.lines if "uthenticat" in line), text[-200:])[:200]
        return outcome

    def run(self) -> int:
        outcomes: list[Outcome] = []
        scale: list[dict] = []
        try:
            self._run(outcomes, scale)
        except Exception as exc:  # the bring-up or the run broke: say where, in the table too
            outcomes.append(Outcome("the fleet ran to its end", detail=f"{type(exc).__name__}: {exc}"))
        report(outcomes, scale, self.out)
        return 0 if outcomes and all(o.passed for o in outcomes) else 1

    def _stop_driver(self) -> None:
        assert self.driver is not None and self.driver.popen.stdin is not None
        self.driver.popen.stdin.write("stop\n")
        self.driver.popen.stdin.flush()
        self.driver.popen.wait(120)

    def _run(self, outcomes: list[Outcome], scale: list[dict]) -> None:
        self.start_head()
        outcomes.append(self.auth_refused())
        self.start_site(self.sites[0])
        self.start_robots(self.sites[0])
        window = 30.0 if self.quick else 60.0
        if not self.quick:
            self.start_driver(1)
            scale.append(self.measure("one site", 1, window))
            self._stop_driver()
        self.start_site(self.sites[1])
        self.start_robots(self.sites[1])
        self.start_driver(2)
        scale.append(self.measure("two sites", 2, window))
        for scenario in (self.runner_killed, self.site_restarted, self.site_cut, self.driver_restarted):
            started = time.monotonic()
            try:
                outcome = scenario()
            except Exception as exc:  # a scenario that breaks is a failed scenario; the others still run
                outcome = Outcome(scenario.__name__, detail=f"{type(exc).__name__}: {exc}")
            verdict = "PASS" if outcome.passed else "FAIL"
            print(f"[fleet] {outcome.name}: {verdict} ({time.monotonic() - started:.0f} s)")
            sys.stdout.flush()
            outcomes.append(outcome)
        # the end of the run: every bridge is told (plugrl-server-stop) and waits for the next one
        marks = {name: len(b.lines) for name, b in self.bridges.items()}
        self._stop_driver()
        told = [
            self.bridges[name].wait_for(
                lambda lines, n=marks[name]: any("plugrl-server-stop" in x for x in lines[n:]), 30
            )
            for name in self.bridges
        ]
        outcomes.append(Outcome("the run's end reaches every bridge", passed=all(told)))


def component(cmdline: str) -> str:
    """What a process of the fleet is, from its command line."""
    for needle, name in (
        ("PlugRLEnvRunner", "runner"),
        ("driver.py", "driver + learner"),
        ("robot_node", "robots"),
        ("bridge_main", "bridge"),
        ("gcs_server", "ray gcs"),
        ("raylet", "ray raylet"),
    ):
        if needle in cmdline:
            return name
    return "ray other"


def report(outcomes: list[Outcome], scale: list[dict], out: Path) -> None:
    print("\n| scenario | result | time to recover | env steps lost |")
    print("|---|---|---|---|")
    for o in outcomes:
        recover = "-" if o.recover_s is None else f"{o.recover_s:.1f} s"
        lost = "-" if o.steps_lost is None else str(o.steps_lost)
        print(f"| {o.name} | {'PASS' if o.passed else 'FAIL'} | {recover} | {lost} |")
    for o in outcomes:
        if o.detail or o.bridge_log or o.runner_log:
            print(f"\n{o.name}: {o.detail}")
            for line in o.bridge_log:
                print(f"    bridge: {line}")
            for line in o.runner_log:
                print(f"    ray:    {line}")
    if scale:
        print("\n| layout | robots | env steps/s | updates/min | weights | head sent per iteration | weights sync |")
        print("|---|---|---|---|---|---|---|")
        for s in scale:
            sync = "-" if s["sync_weights_s"] is None else f"{1000 * s['sync_weights_s']:.0f} ms"
            print(
                f"| {s['label']} | {s['robots']} | {s['env_steps_per_s']:.1f} | {s['updates_per_min']:.1f} | "
                f"{(s['weights_bytes'] or 0) / 1024:.0f} KiB | {s['head_tx_bytes_per_iteration'] / 1024:.0f} KiB | "
                f"{sync} |"
            )
            print(f"    (head received {s['head_rx_bytes_per_step']:.0f} bytes per env step)")
        for s in scale:
            print(f"\nCPU ms per env step, {s['label']} (host busy {100 * s['cpu_share_of_host']:.0f} %):")
            for k, v in s["cpu_ms_per_step"].items():
                print(f"    {k}: {v}")
    (out / "fleet.json").write_text(json.dumps({"scenarios": [asdict(o) for o in outcomes], "scale": scale}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the one-site scale run; shorter windows")
    parser.add_argument("--out", type=Path, default=None, help="logs and fleet.json (default: a temporary dir)")
    args = parser.parse_args()
    why = unavailable()
    if why is not None:
        print(f"fleet: {why}", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="plugrl-fleet-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"[fleet] logs in {out}")
    harness = Harness(out, args.quick)
    with harness.fleet:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            return harness.run()
        except KeyboardInterrupt:
            print("[fleet] interrupted; tearing down", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
