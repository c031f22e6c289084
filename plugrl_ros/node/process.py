"""The bridge's process: allocator tuning, the spin loop that survives a transient rclpy fault, and ``main``.

``main`` runs behind :mod:`plugrl_ros.node.bridge_main`, which installs the
stop handlers before anything heavy is imported (see
:mod:`plugrl_ros.executables`).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import sys
import time

import rclpy
from rclpy.context import Context
from rclpy.executors import Executor, SingleThreadedExecutor

from plugrl_ros import stop_request
from plugrl_ros.node.bridge_node import BridgeNode
from plugrl_ros.params.command_line import explain_refusal
from plugrl_ros.params.section import ConfigError
from plugrl_ros.record.recorder import RecordError
from plugrl_ros.train.train_mode import EXIT_OK

EXIT_CONFIG = 2  # the command line or the parameters are wrong: the user can fix it

# rclpy can fail to take one message (seen with the Jazzy wheels, "Unable to convert call
# argument", while a robot's publishers restart). Losing that message is better than
# stopping every robot; a fault that keeps coming is not transient and ends the bridge.
_TRANSIENT_FAULTS_ALLOWED = 20
_TRANSIENT_FAULT_WINDOW_S = 10.0


# The executor: rclpy's EventsExecutor from Kilted's rclpy (9.x) on: it dispatches from rcl's event
# callbacks in C++, where the SingleThreadedExecutor rebuilds and scans a wait set in Python on every
# turn (half the bridge's CPU per lockstep step). Jazzy's rclpy (7.x) has one too, but its timers did
# not follow a simulated clock (use_sim_time: the control loop ticked while /clock stood still) and
# it aborted a bridge at exit once ("terminate called without an active exception"): Jazzy and
# anything not known keep the SingleThreadedExecutor. PLUGRL_EXECUTOR=single|events overrides.
EXECUTOR_VARIABLE = "PLUGRL_EXECUTOR"
EXECUTORS = ("events", "single")
_OLDER_DISTROS = ("foxy", "galactic", "humble", "iron", "jazzy")


def default_executor() -> str:
    """``events`` where this rclpy's EventsExecutor is known to serve the bridge (Kilted on), else ``single``."""
    try:
        major = int(importlib.metadata.version("rclpy").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):  # a ROS install without pip metadata
        distro = os.environ.get("ROS_DISTRO", "")
        return "events" if distro and distro not in _OLDER_DISTROS else "single"
    return "events" if major >= 9 else "single"


def make_executor(choice: str | None = None, context: Context | None = None) -> Executor:
    """The bridge's executor: ``choice`` (default: $PLUGRL_EXECUTOR, else :func:`default_executor`)."""
    choice = choice or os.environ.get(EXECUTOR_VARIABLE) or default_executor()
    if choice not in EXECUTORS:
        allowed = f"allowed: {' or '.join(EXECUTORS)} (the environment variable picking the rclpy executor)"
        raise ConfigError(EXECUTOR_VARIABLE, choice, allowed)
    if choice == "events":
        try:
            from rclpy.experimental import EventsExecutor
        except ImportError:  # an rclpy older than Jazzy's
            return SingleThreadedExecutor(context=context)
        return EventsExecutor(context=context)
    return SingleThreadedExecutor(context=context)


def spin_resiliently(executor: Executor, node: BridgeNode) -> None:
    """One executor turn; a transient rclpy fault is logged and survived, a persistent one re-raised."""
    try:
        executor.spin_once(timeout_sec=0.1)
    except RuntimeError as exc:
        now = time.monotonic()
        faults = node.transient_faults
        faults.append(now)
        while faults and faults[0] < now - _TRANSIENT_FAULT_WINDOW_S:
            faults.popleft()
        if len(faults) > _TRANSIENT_FAULTS_ALLOWED:
            raise
        node.get_logger().error(f"ROS failed to deliver a message ({exc}); it is lost, the bridge carries on")


# glibc's mallopt parameters
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Every camera message, observation batch and frame is a buffer of the same
# few sizes, allocated and freed tens of times a second. glibc serves blocks
# above its mmap threshold (128 KiB at first) with fresh mmaps and returns
# freed heap tops to the kernel, so each of them was page-faulted in again:
# 12,000-20,000 faults a second, milliseconds at a time under the GIL, which
# the control tick then waited for. Keep such blocks in the heap instead
# (32 MiB is glibc's largest threshold) and the freed memory with the process.
_MMAP_THRESHOLD_BYTES = 32 << 20
_TRIM_THRESHOLD_BYTES = 256 << 20


def tune_process() -> None:
    """Keep the allocator from handing the bridge's large buffers back to the kernel after every use."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return  # not glibc: its allocator needs no such help, or offers none
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)


def main(args: list[str] | None = None) -> int:
    """``ros2 run plugrl_ros bridge --ros-args --params-file bridge.yaml``."""
    from rclpy.signals import SignalHandlerOptions

    # SIGINT/SIGTERM only ask for a stop (see stop_request): the loop below ends, the actuators
    # are idled while the ROS context is still valid, then the trainer connection is closed.
    stop_request.install()
    tune_process()
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except RuntimeError as exc:  # rcl refusing the command line: a user mistake, not a crash
        error = explain_refusal(str(exc))
        if error is not None:
            print(f"[plugrl_bridge] configuration error: {error}", file=sys.stderr)
        else:
            reason = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            print(f"[plugrl_bridge] cannot read the command line: {reason}", file=sys.stderr)
        return EXIT_CONFIG
    node: BridgeNode | None = None
    # Shut down explicitly before the context: an executor left to the garbage collector
    # destroys its guard condition after rclpy.shutdown and prints a traceback on the way out.
    executor: Executor | None = None
    code = EXIT_OK
    try:
        executor = make_executor()
        if stop_request.requested():
            return EXIT_OK  # stopped while starting: no actuator has been touched
        node = BridgeNode(command_line=sys.argv if args is None else args)
        executor.add_node(node)
        # a stop is seen within one turn (0.1 s): the handler cannot wake rcl's wait, and needs not
        while not node.finished and not stop_request.requested():
            spin_resiliently(executor, node)
        if stop_request.requested() and not node.finished:
            node.get_logger().info("interrupted: idling the actuators and closing the link (trainer or policy server)")
        if node.crash is not None:
            node.publish_diagnostics()  # the operator's dashboard shows why the bridge is gone, not just that it is
            node.flush_diagnostics()
        code = node.exit_code
    except ConfigError as exc:
        print(f"[plugrl_bridge] configuration error: {exc}", file=sys.stderr)
        code = EXIT_CONFIG
    except RecordError as exc:  # record.path names a folder the bridge cannot record into
        print(f"[plugrl_bridge] cannot record: {exc}", file=sys.stderr)
        code = EXIT_CONFIG
    finally:
        if node is not None:
            node.shutdown_gracefully()
        if executor is not None:
            executor.shutdown()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return code
