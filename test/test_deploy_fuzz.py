"""Fuzz of the deploy-mode node path: hypothesis-made malformed policy-server answers, through real processes.

A real websocket server (on a thread here) answers the bridge process's
requests with good encoded chunks, except that each hypothesis example
replaces one answer with something malformed: wrong shapes (huge ones too),
wrong dtypes, NaN or infinity, a missing action key (with extra keys or
without), no map at all, bytes that are no msgpack, or a new connection
whose metadata is wrong. Every malformed value carries ``BAD``; the test
listens on the actuator topic and no message may ever carry it. The bridge
must reject each malformed answer (counted on /diagnostics, logged with what
was wrong), keep running, and reconnect when the connection itself was bad.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import msgpack
import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from harness import bridge, env_status, first_diag, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_deploy_node import WIDTH, CountingRobot, decoded, deploy_params, has_env_entry

from plugrl_ros.protocol import codec
from plugrl_ros.tools.test_policy_server import encoded_chunk

pytestmark = [pytest.mark.ros, pytest.mark.websockets]

H = 20
BAD = 777.0


@dataclass(frozen=True)
class Raw:
    """A binary frame sent as it is (not msgpack-encoded by the server)."""

    frame: bytes


@dataclass(frozen=True)
class Metadata:
    """Close the connection instead of answering; the next connection opens with this metadata frame."""

    frame: bytes
    refused: bool  # it contradicts the configured shape: the bridge must close that connection too


def full(shape: tuple[int, ...], dtype: str = "<f4") -> np.ndarray:
    return np.full(shape, BAD).astype(dtype)


good_shape_floats = st.sampled_from(["<f4", "<f8", ">f8"]).map(lambda dtype: full((H, WIDTH), dtype))
float_dtypes = st.sampled_from(["<f4", "<f8"])
wrong_widths = st.builds(
    full, st.tuples(st.just(H), st.integers(0, 3 * WIDTH).filter(lambda d: d != WIDTH)), float_dtypes
)
wrong_horizons = st.builds(
    full,
    st.one_of(st.integers(0, 3 * H), st.integers(5_000, 60_000)).filter(lambda h: h != H).map(lambda h: (h, WIDTH)),
    float_dtypes,
)  # up to ~1 MB
wrong_ndims = st.builds(
    full,
    st.one_of(
        st.tuples(st.integers(0, 3 * H)),  # one-dimensional
        st.tuples(st.just(H), st.just(WIDTH), st.integers(1, 3)),  # three-dimensional
        st.tuples(st.just(H), st.integers(2_000, 12_000)),  # far too wide: up to ~1 MB
    ),
    float_dtypes,
)
wrong_dtypes = st.sampled_from(["<i4", "<i8", "|u1", "|b1", "<U8", "|S4"]).map(lambda d: full((H, WIDTH), d))


@st.composite
def broken_ndarrays(draw: st.DrawFn) -> Raw:
    """``{"actions": <__ndarray__ map>}`` packed by hand, as another server's codec might: a dtype this protocol
    has no place for, or data that does not fit its dtype and shape."""
    dtype = draw(st.sampled_from(["<c16", "|O", "|V8", "<f4", "<f8", "f4", "nonsense"]))
    shape = draw(st.sampled_from([[H, WIDTH], [H, WIDTH, 1], [-H, WIDTH], [H], []]))
    data = np.full(H * WIDTH, BAD, "<f4").tobytes()
    if dtype in ("<f4", "f4") and shape == [H, WIDTH]:
        data = data[: -draw(st.integers(1, 8))]  # otherwise it would be a good chunk
    array = {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}
    return Raw(msgpack.packb({"actions": array}))


@st.composite
def non_finite(draw: st.DrawFn) -> np.ndarray:
    actions = draw(good_shape_floats).copy()
    for _ in range(draw(st.integers(1, 4))):
        actions[draw(st.integers(0, H - 1)), draw(st.integers(0, WIDTH - 1))] = draw(
            st.sampled_from([np.nan, np.inf, -np.inf])
        )
    return actions


not_arrays = st.one_of(
    st.just([[BAD] * WIDTH] * H),  # nested lists
    st.sampled_from([BAD, "777", None, {"values": BAD}]),
)
extras = st.dictionaries(
    st.text(min_size=1, max_size=12).filter(lambda k: k != "actions"),
    st.one_of(st.floats(allow_nan=True), st.text(max_size=20), st.none(), st.just(full((2, 2)))),
    max_size=4,
)


def in_map(actions: st.SearchStrategy) -> st.SearchStrategy:
    """``{"actions": <malformed>}`` with some extra keys beside it (ignored when the actions are good)."""
    return st.builds(lambda value, extra: {**extra, "actions": value}, actions, extras)


missing_key = st.one_of(
    st.builds(lambda extra: {**extra, "action": full((H, WIDTH))}, extras),  # the action key misspelled
    extras,  # no action key at all
)
non_maps = st.one_of(
    st.just(full((H, WIDTH))),  # the chunk itself, not in a map
    st.lists(st.just(BAD), max_size=8),
    st.integers(),
    st.text(max_size=20),
    st.none(),
    st.binary(max_size=20),
)
raw_frames = st.binary(max_size=64).map(Raw)  # mostly no msgpack at all
metadata = st.one_of(
    st.integers(1, 200).filter(lambda h: h != H).map(lambda h: Metadata(codec.packb({"action_horizon": h}), True)),
    st.integers(1, 64).filter(lambda d: d != WIDTH).map(lambda d: Metadata(codec.packb({"action_dim": d}), True)),
    # tolerated: nothing usable announced, so the configured shape holds
    st.sampled_from([[1, 2], "meta", {"action_horizon": "twenty"}]).map(lambda m: Metadata(codec.packb(m), False)),
    st.just(Metadata(b"\xc1", True)),  # 0xc1: never valid msgpack
)
# every kind gets its own examples, so each run covers all of them
KINDS = {
    "wrong width": in_map(wrong_widths),
    "wrong horizon": in_map(wrong_horizons),
    "wrong dimensions": in_map(wrong_ndims),
    "wrong dtype": in_map(wrong_dtypes),
    "NaN or infinity": in_map(non_finite()),
    "not an array": in_map(not_arrays),
    "action key missing": missing_key,
    "not a map": non_maps,
    "not msgpack": raw_frames,
    "broken __ndarray__": broken_ndarrays(),
    "wrong metadata": metadata,
}
EXAMPLES_PER_KIND = 3


class FuzzPolicyServer:
    """A policy server on a thread: good encoded chunks, except a queued malformed answer for the next request."""

    def __init__(self) -> None:
        from websockets.sync.server import serve

        self._lock = threading.Lock()
        self._queue: list[object] = []
        self._metadata: bytes | None = None
        self.requests = 0  # answered or closed on, over every connection
        self.connections = 0
        self.server = serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None)
        self.port = self.server.socket.getsockname()[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def queue(self, answer: object) -> int:
        """``answer`` goes to the next request; the number that request will have."""
        with self._lock:
            self._queue.append(answer)
            return self.requests + len(self._queue) - 1

    def _handle(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            self._serve(ws)
        except ConnectionClosed:
            pass  # the bridge closed it (a contract it refused): it reconnects

    def _serve(self, ws) -> None:
        with self._lock:
            self.connections += 1
            first, self._metadata = self._metadata, None
        ws.send(first if first is not None else codec.packb({"action_horizon": H, "action_dim": WIDTH}))
        for frame in ws:
            observation = codec.unpackb(frame)
            stamp = float(np.asarray(observation["observation/state"]).reshape(-1)[0])
            with self._lock:
                answer = self._queue.pop(0) if self._queue else None
                number = self.requests
                self.requests += 1
                if isinstance(answer, Metadata):
                    self._metadata = answer.frame
            if isinstance(answer, Metadata):
                ws.close()
                return
            if isinstance(answer, Raw):
                ws.send(answer.frame)
            elif answer is None:
                ws.send(codec.packb({"actions": encoded_chunk(number, stamp, H, WIDTH)}))
            else:
                ws.send(codec.packb(answer))

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(10)


def carries_bad(row: np.ndarray) -> bool:
    return bool(np.isclose(row, BAD).any())


def test_malformed_policy_answers_never_reach_the_actuator_and_the_bridge_keeps_running(tmp_path, robot):
    server = FuzzPolicyServer()
    counting = CountingRobot(robot)
    diagnostics = robot.listen(DiagnosticArray, "/diagnostics")
    sent: list[object] = []
    params = deploy_params(server.port, "switch", H)
    try:
        with bridge(tmp_path, params) as child:
            wait_until(lambda: sum(d is not None for d in decoded(counting.rows())) > 20, 120, "good chunks running")

            def one(answer: object) -> None:
                number = server.queue(answer)
                sent.append(answer)
                # that request answered (or its connection closed), and one good answer after it
                wait_until(lambda: server.requests >= number + 2, 60, f"request {number} and the next one")
                assert child.proc.poll() is None, "the bridge exited"

            for kind in KINDS.values():
                settings(
                    max_examples=EXAMPLES_PER_KIND,
                    deadline=None,
                    database=None,
                    derandomize=True,  # the same examples on every run: a CI failure reproduces
                    suppress_health_check=list(HealthCheck),
                )(given(answer=kind)(one))()
            moved_at = len(counting.rows())
            wait_until(
                lambda: sum(d is not None for d in decoded(counting.rows()[moved_at:])) > 10, 60, "moving after it"
            )
            since = wait_until(lambda: diagnostics.timed()[-1][0] if len(diagnostics) else None, 30, "diagnostics")
            _, diag = first_diag(diagnostics, has_env_entry, 30, "diagnostics after the fuzz", since=since)
            values = env_status(diag, 0)[2]
            output = child.output()
            assert child.proc.poll() is None
    finally:
        server.close()

    rows = counting.rows()
    assert not any(carries_bad(row) for row in rows), [row for row in rows if carries_bad(row)][:3]
    answers = [a for a in sent if not isinstance(a, Metadata)]
    reconnects = len(sent) - len(answers)
    # every malformed answer was rejected, one by one, and nothing else was
    assert int(values["answers rejected"]) == len(answers), (values, len(answers))
    if answers:
        rejected = [line for line in output.splitlines() if "answer was rejected, nothing of it runs:" in line]
        assert rejected, output
        # each says what was wrong, and where: "<the answer, its action key or an array's field>: <why>"
        details = [line.split("nothing of it runs: ", 1)[1] for line in rejected]
        assert all(re.match(r"[\w ]+: \S.{8}", detail) for detail in details), details
    assert server.connections >= 1 + reconnects
    if any(isinstance(a, Metadata) and a.refused for a in sent):
        assert "the server broke the contract: metadata" in output, output
