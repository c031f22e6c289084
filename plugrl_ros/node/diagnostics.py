"""The bridge's status as diagnostic_msgs: what the mode reports, and the recorder's entry."""

from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from plugrl_ros.record.recorder import RecorderState, RecorderStatus
from plugrl_ros.robot.status import ERROR, WARN, Entry
from plugrl_ros.thread_guard import EXIT_CRASHED, Crash


def status_array(entries: list[Entry], hardware_id: str, stamp: object) -> DiagnosticArray:
    array = DiagnosticArray()
    array.header.stamp = stamp
    for entry in entries:
        status = DiagnosticStatus(level=entry.level, name=entry.name, message=entry.message, hardware_id=hardware_id)
        status.values = [KeyValue(key=k, value=str(v)) for k, v in entry.values.items()]
        array.status.append(status)
    return array


def recording_entry(prefix: str, status: RecorderStatus) -> Entry:
    """The recorder's state: what it wrote, what it dropped (the writer fell behind), and why it stopped."""
    entry = Entry(f"{prefix}: recording")
    entry.values = {
        "state": status.state.value,
        "accepted": str(status.accepted),
        "dropped": str(status.dropped),
        "dropped with images": str(status.dropped_large),
        "written": str(status.written),
        "files": " ".join(str(path) for path in status.files) or "-",
    }
    if status.state is RecorderState.FAILED:
        entry.worse(ERROR, f"recording stopped: {status.error}")
    elif status.dropped:
        entry.worse(WARN, f"{status.dropped} record(s) dropped: the writer fell behind")
    return entry


def crash_entry(prefix: str, crash: Crash) -> Entry:
    """A thread that died of an error nobody expected: the bridge is exiting to be restarted."""
    entry = Entry(f"{prefix}: process", values={"thread": crash.thread, "error": crash.error})
    entry.worse(ERROR, f"the {crash.thread} thread died ({crash.error}); exiting with {EXIT_CRASHED} to be restarted")
    return entry
