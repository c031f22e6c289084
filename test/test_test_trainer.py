"""Tests of the protocol-checking test trainer: a correct raw client passes, and each violation fails its clause."""

from __future__ import annotations

import asyncio
import itertools
import re
import subprocess
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from plugrl_ros import executables
from plugrl_ros.protocol.codec import packb, unpackb
from plugrl_ros.tools.serving import TrainerThread
from plugrl_ros.tools.test_trainer import (
    ALTERNATION,
    CHUNK_LENGTH,
    CLAUSES,
    ENV_SETS,
    INFO_EPISODE,
    LARGE_METADATA,
    NO_COMPRESSION,
    NO_EMPTY_CONNECTIONS,
    OBSERVATION,
    RECONNECTS,
    RESET_OBSERVATION,
    REUSE,
    REWARD_SUM,
    STOP_EXITS,
    TERMINAL_OBSERVATION,
    TEXT_FATAL,
    TIME_MAJOR,
    WAITS_FOR_METADATA,
    Report,
    TestTrainer,
    TrainerSettings,
    action_chunk,
    main,
)

pytestmark = [pytest.mark.websockets]

REPO = Path(__file__).resolve().parents[1]
STOP = "plugrl-server-stop"
RUN_TIMEOUT_S = 20.0


def fast(**overrides: object) -> TrainerSettings:
    """Settings that keep one run well under a second or two."""
    values: dict = {
        "port": 0,
        "feedbacks_per_connection": 3,
        "metadata_delay_s": 0.05,
        "grace_s": 0.3,
        "reconnect_window_s": 3.0,
    }
    values.update(overrides)
    return TrainerSettings(**values)


def episode_length(env: int) -> int:
    return 3 + 2 * (env % 3)


def i8(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype="<i8").reshape(len(values))


class RawProbeClient:
    """A small probe client written straight on websockets and the codec.

    Correct by default. Each name in ``faults`` makes it break one rule, so a
    test can check that the trainer pins the failure on the right clause.
    """

    def __init__(
        self,
        port: int,
        n_envs: int = 2,
        faults: Collection[str] = (),
        compression: str | None = None,
        stop_after: int | None = None,
        text_as_list: bool = False,
    ) -> None:
        self.uri = f"ws://127.0.0.1:{port}"
        self.n = n_envs
        self.faults = set(faults)
        self.compression = compression
        self.stop_after = stop_after
        self.text_as_list = text_as_list
        self.d = 0
        self.t = [0] * n_envs
        self.a = np.zeros((n_envs, 0))
        self.step_ids = [0] * n_envs
        self.connections = 0
        self.feedbacks_sent = 0
        self.stops = 0
        self.last_feedback: bytes | None = None
        self.replayed = False

    async def run(self) -> str:
        """Connect and reconnect until the trainer stops us ("stop"), sends text ("fatal"), or we are done."""
        while True:
            self.connections += 1
            try:
                async with connect(
                    self.uri, compression=self.compression, max_size=None, ping_interval=None, open_timeout=5
                ) as ws:
                    ending = await self._session(ws)
            except ConnectionClosed as exc:
                ending = "stop" if exc.rcvd is not None and exc.rcvd.reason == STOP else "lost"
            if ending == "stop":
                self.stops += 1
                if "reconnect-after-stop" in self.faults and self.stops == 1:
                    continue
            if ending in ("stop", "fatal", "done"):
                return ending
            # any other close: reconnect at once (the trainer does not judge the delay)

    def _observation(self, envs: list[int], t: list[float] | None = None, a: np.ndarray | None = None) -> dict:
        t = [self.t[e] for e in envs] if t is None else t
        a = self.a[envs] if a is None else a
        text = ["probe"] * len(envs)
        return {
            "images": {},
            "states": {
                "t": np.asarray(t, dtype="<f8").reshape(len(envs), 1),
                "a": np.asarray(a, dtype="<f8").reshape(len(envs), self.d),
            },
            "text": text if self.text_as_list else np.asarray(text, dtype="<U5").reshape(len(envs)),
        }

    async def _fatal(self, ws: ClientConnection) -> str:
        if "continue-after-text" in self.faults:
            # three frames: more than the feedback and infer that may cross the text frame in flight
            for _ in range(3):
                await ws.send(
                    packb(
                        {
                            "message_type": "infer",
                            "data": self._observation([]),
                            "env_indices": i8([]),
                            "step_ids": i8([]),
                        }
                    )
                )
        await ws.close(1003, "text frame")
        return "fatal"

    async def _session(self, ws: ClientConnection) -> str:
        if "speak-first" in self.faults and self.connections == 1:
            self.d = 2
            self.a = np.zeros((self.n, 2))
            await ws.send(
                packb(
                    {
                        "message_type": "infer",
                        "data": self._observation([0]),
                        "env_indices": i8([0]),
                        "step_ids": i8([0]),
                    }
                )
            )
        frame = await ws.recv()
        if isinstance(frame, str):
            return await self._fatal(ws)
        metadata = unpackb(frame)["data"]
        horizon, self.d = metadata["action_horizon"], metadata["action_dim"]
        if self.a.shape[1] != self.d:
            self.a = np.zeros((self.n, self.d))
        reuse_offered = "reuse-feedback-obs" in metadata["features"]
        if "feedback-after-reconnect" in self.faults and self.connections > 1 and not self.replayed:
            self.replayed = True
            await ws.send(self.last_feedback)
        ended_last: dict[int, bool] = {}  # this connection's last feedback per env: terminal or not
        chunks: dict[int, list] = {}
        need = list(range(self.n))
        first = True
        while True:
            reuse = None
            if reuse_offered:
                reuse = [e in ended_last and (not ended_last[e] or "reuse-after-terminal" in self.faults) for e in need]
            elif "reuse-unoffered" in self.faults:
                reuse = [False] * len(need)
            rows = [e for e, r in zip(need, reuse or [False] * len(need)) if not r]
            infer = {
                "message_type": "infer",
                "data": self._observation(rows),
                "env_indices": i8(need),
                "step_ids": i8([self.step_ids[e] for e in need]),
            }
            if reuse is not None:
                infer["reuse"] = np.asarray(reuse, dtype="|b1").reshape(len(reuse))
            await ws.send(packb(infer))
            if "double-infer" in self.faults and first:
                await ws.send(packb(infer))
            first = False

            reply = await ws.recv()
            if isinstance(reply, str):
                return await self._fatal(ws)
            action = unpackb(reply)["data"]["action"].astype(np.float64)
            for row, env in enumerate(need):
                if "env-major" in self.faults:
                    chunk = action.reshape(len(need), horizon, self.d)[row]
                else:
                    chunk = action[:, row, :]
                chunks[env] = [chunk, 0]

            # Step every env that holds a chunk until at least one chunk ends.
            done: list[tuple[int, bool, int]] = []
            while not done:
                for env in sorted(chunks):
                    chunk = chunks[env]
                    self.a[env] = chunk[0][chunk[1]]
                    self.t[env] += 1
                    chunk[1] += 1
                    terminated = self.t[env] == episode_length(env)
                    if terminated or chunk[1] == horizon:
                        done.append((env, terminated, chunk[1]))
            envs = [env for env, _, _ in done]
            terminated = [term for _, term, _ in done]
            t = [self.t[e] for e in envs]
            a = self.a[envs].copy()
            if "reset-in-step" in self.faults:
                t = [0 if term else v for v, term in zip(t, terminated)]
                a[np.asarray(terminated)] = 0.0
            rewards = [1.0 if "last-step-reward" in self.faults else float(steps) for _, _, steps in done]
            step_ids = [self.step_ids[e] for e in envs]
            if "feedback-unheld" in self.faults and self.feedbacks_sent == 1:
                envs, t, rewards, step_ids = [*envs, 7], [*t, 0], [*rewards, 0.0], [*step_ids, 0]
                terminated = [*terminated, False]
                a = np.vstack([a, np.zeros((1, self.d))])
            m = len(envs)
            info = {}
            if any(terminated):
                lengths = [episode_length(e) if term else 0 for e, term in zip(envs, terminated)]
                info = {
                    "episode": {
                        "r": np.asarray(lengths, dtype="<f4"),
                        "l": np.asarray(lengths, dtype="<i8"),
                        "s": np.zeros(m, dtype="|b1"),
                        "mask": np.asarray(terminated, dtype="|b1"),
                    }
                }
            if "info-unsplittable" in self.faults and m > 1:
                info = {"task": "pick"}  # nothing of length m to split per env (the protocol's §5.4, docs/protocol.md)
            if "info-intervention" in self.faults:
                info = {**info, "intervention": {"active": np.zeros((m, 2), dtype=np.bool_)}}
            feedback = {
                "message_type": "feedback",
                "env_indices": i8(envs),
                "step_ids": i8(step_ids),
                "data": {
                    "obs": self._observation(envs, t, a),
                    "rewards": np.asarray(rewards, dtype="<f4"),
                    "terminated": np.asarray(terminated, dtype="|b1"),
                    "truncated": np.zeros(m, dtype="|b1"),
                    "info": info,
                },
            }
            # The envs move on whether or not the feedback reaches the trainer:
            # the terminated ones reset now, before the send can fail.
            for env, term, _ in done:
                del chunks[env]
                ended_last[env] = term
                if term:
                    self.t[env], self.a[env], self.step_ids[env] = 0, 0.0, 0
                else:
                    self.step_ids[env] += 1
            self.last_feedback = packb(feedback)
            await ws.send(self.last_feedback)
            self.feedbacks_sent += 1
            need = [env for env, _, _ in done]
            if self.stop_after is not None and self.feedbacks_sent >= self.stop_after:
                await ws.close(1000)
                return "done"


def run_client(settings: TrainerSettings, **client: object) -> tuple[Report, str]:
    """One trainer run against one RawProbeClient; returns the report and how the client ended."""

    async def scenario() -> tuple[Report, str]:
        trainer = TestTrainer(settings)
        port = await trainer.start()
        ending = await asyncio.wait_for(RawProbeClient(port, **client).run(), RUN_TIMEOUT_S)
        return await trainer.finished(timeout=RUN_TIMEOUT_S), ending

    return asyncio.run(scenario())


def failed(report: Report) -> set[str]:
    return {c.name for c in report.clauses if c.status == "FAIL"}


def details(report: Report, clause: str) -> str:
    return "\n".join(report.clause(clause).failures)


# -- a correct client passes -----------------------------------------------------------


def test_correct_client_passes_resync_then_stop_with_every_probe_clause_exercised() -> None:
    report, ending = run_client(fast(script=("resync", "stop")), n_envs=3)
    assert ending == "stop"
    assert report.failed == 0, report.text()
    for clause in (
        NO_COMPRESSION,
        WAITS_FOR_METADATA,
        LARGE_METADATA,
        ALTERNATION,
        ENV_SETS,
        REUSE,
        CHUNK_LENGTH,
        REWARD_SUM,
        TERMINAL_OBSERVATION,
        TIME_MAJOR,
        RESET_OBSERVATION,
        INFO_EPISODE,
        RECONNECTS,
        STOP_EXITS,
    ):
        assert report.clause(clause).status == "PASS", clause
    assert report.clause(TEXT_FATAL).status == "not exercised"
    assert report.clause(RECONNECTS).passed == 1
    assert report.text().splitlines()[-1] == f"{report.passed} passed, 0 failed"


def test_the_transcript_holds_every_message_in_order_with_the_chunk_each_infer_got() -> None:
    report, ending = run_client(fast(script=("resync", "stop"), keep_transcript=True), n_envs=3)
    assert ending == "stop"
    assert report.failed == 0, report.text()
    transcript = report.transcript
    assert [e.connection for e in transcript] == sorted(e.connection for e in transcript)
    assert {e.connection for e in transcript} == {1, 2}
    infers = [e for e in transcript if e.kind == "infer"]
    feedbacks = [e for e in transcript if e.kind == "feedback"]
    assert len(feedbacks) == 2 * 3  # feedbacks_per_connection on each connection
    for connection in (1, 2):
        kinds = [e.kind for e in transcript if e.connection == connection]
        assert kinds[0] == "infer" and all(a != b for a, b in itertools.pairwise(kinds)), kinds  # they alternate
    for entry in infers:
        assert entry.action is not None and entry.rewards is None
        assert np.array_equal(entry.action, action_chunk(entry.env_indices, 4, 2, "<f4"))
        assert entry.observation["states"]["t"].shape[0] == len(entry.env_indices) - sum(entry.reuse or ())
    for entry in feedbacks:
        assert entry.action is None and entry.rewards is not None and entry.terminated is not None
        assert len(entry.rewards) == len(entry.env_indices) == entry.observation["states"]["t"].shape[0]


def test_without_keep_transcript_the_report_holds_none() -> None:
    report, _ = run_client(fast(script=("stop",)), n_envs=1)
    assert report.failed == 0, report.text()
    assert report.transcript == ()


def test_correct_client_with_reuse_passes_a_text_ending() -> None:
    report, ending = run_client(fast(script=("text",), features=("reuse-feedback-obs",)), n_envs=3)
    assert ending == "fatal"
    assert report.failed == 0, report.text()
    assert report.clause(REUSE).passed > 0
    assert report.clause(TEXT_FATAL).passed == 3  # nothing more sent, closed, no reconnect
    assert report.clause(STOP_EXITS).status == "not exercised"


def test_correct_client_reconnects_after_timeout_crash_and_drop_and_may_stop_itself() -> None:
    report, ending = run_client(fast(script=("timeout", "crash", "drop", "serve")), stop_after=20)
    assert ending == "done"
    assert report.failed == 0, report.text()
    assert report.clause(RECONNECTS).passed == 3
    assert not any("code 1000" in note for note in report.notes), report.notes


def test_text_as_a_list_of_str_is_a_note_not_a_failure() -> None:
    report, _ = run_client(fast(script=("stop",)), text_as_list=True)
    assert report.failed == 0, report.text()
    assert report.clause(OBSERVATION).passed > 0
    assert any("list of str" in note for note in report.notes)


# -- each violation is caught by its clause ---------------------------------------------


def test_speaking_before_the_metadata_fails_waits_for_metadata() -> None:
    report, _ = run_client(fast(), faults={"speak-first"})
    assert failed(report) == {WAITS_FOR_METADATA}, report.text()
    assert "before the metadata" in details(report, WAITS_FOR_METADATA)


def test_offering_compression_fails_no_compression() -> None:
    report, _ = run_client(fast(script=("stop",)), compression="deflate")
    assert failed(report) == {NO_COMPRESSION}, report.text()
    assert "permessage-deflate" in details(report, NO_COMPRESSION)


def test_two_infers_in_a_row_fail_alternation() -> None:
    report, _ = run_client(fast(), faults={"double-infer"})
    assert failed(report) == {ALTERNATION}, report.text()
    assert "a second infer" in details(report, ALTERNATION)


def test_feedback_for_an_env_holding_no_action_fails_env_sets() -> None:
    report, _ = run_client(fast(script=("stop",)), faults={"feedback-unheld"})
    assert failed(report) == {ENV_SETS}, report.text()
    assert "env 7 holds no action" in details(report, ENV_SETS)


def test_reuse_when_not_offered_fails_reuse() -> None:
    report, _ = run_client(fast(script=("stop",)), faults={"reuse-unoffered"})
    assert failed(report) == {REUSE}, report.text()
    assert "did not offer" in details(report, REUSE)


def test_reuse_after_a_terminal_feedback_fails_reuse() -> None:
    settings = fast(script=("stop",), features=("reuse-feedback-obs",), feedbacks_per_connection=6)
    report, _ = run_client(settings, faults={"reuse-after-terminal"})
    assert failed(report) == {REUSE}, report.text()
    assert "after a terminal feedback" in details(report, REUSE)


def test_last_step_reward_instead_of_the_chunk_sum_fails_reward_sum() -> None:
    report, _ = run_client(fast(script=("stop",)), faults={"last-step-reward"})
    assert failed(report) == {REWARD_SUM}, report.text()
    assert re.search(r"reward 1, expected the chunk sum [2-4]\.0", details(report, REWARD_SUM))


def test_env_major_reading_of_the_action_fails_time_major_order() -> None:
    report, _ = run_client(fast(script=("stop",)), n_envs=2, faults={"env-major"})
    assert failed(report) == {TIME_MAJOR}, report.text()
    assert "env-major [n, H, d] reading" in details(report, TIME_MAJOR)


def test_reset_inside_the_step_fails_terminal_observation() -> None:
    report, _ = run_client(fast(script=("stop",), feedbacks_per_connection=4), faults={"reset-in-step"})
    assert failed(report) == {TERMINAL_OBSERVATION}, report.text()
    assert "terminated with t 0" in details(report, TERMINAL_OBSERVATION)


def test_feedback_first_after_a_reconnect_fails_reconnects() -> None:
    report, _ = run_client(fast(), faults={"feedback-after-reconnect"})
    assert failed(report) == {RECONNECTS}, report.text()
    assert "feedback after reconnect" in details(report, RECONNECTS)


def test_sending_after_the_text_frame_fails_text_fatal() -> None:
    report, ending = run_client(fast(script=("text",)), faults={"continue-after-text"})
    assert ending == "fatal"
    assert failed(report) == {TEXT_FATAL}, report.text()
    assert "after the text frame" in details(report, TEXT_FATAL)


def test_reconnecting_after_stop_fails_stop_exits() -> None:
    report, _ = run_client(fast(script=("stop",)), faults={"reconnect-after-stop"})
    assert failed(report) == {STOP_EXITS}, report.text()
    assert "reconnected" in details(report, STOP_EXITS)


def test_a_second_concurrent_connection_is_reported() -> None:
    async def scenario() -> Report:
        trainer = TestTrainer(fast(script=("stop",), metadata_padding_bytes=0))
        port = await trainer.start()
        uri = f"ws://127.0.0.1:{port}"
        async with connect(uri, compression=None, max_size=None) as first:
            await first.recv()  # the metadata: the trainer is serving this one
            async with connect(uri, compression=None, max_size=None) as second:
                with pytest.raises(ConnectionClosed) as closed:
                    await second.recv()
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        await asyncio.wait_for(RawProbeClient(port).run(), RUN_TIMEOUT_S)
        return await trainer.finished(timeout=RUN_TIMEOUT_S)

    report = asyncio.run(scenario())
    # (and the first connection, left after its metadata, was one the client opened for nothing)
    assert failed(report) == {RECONNECTS, NO_EMPTY_CONNECTIONS}, report.text()
    assert "while connection 1 was still open" in details(report, RECONNECTS)


def run_after_one_connection(settings: TrainerSettings, first: Callable[[str], Awaitable[None]]) -> Report:
    """``first`` uses one connection its own way, then a correct client runs the script to its end."""

    async def scenario() -> Report:
        trainer = TestTrainer(settings)
        port = await trainer.start()
        await first(f"ws://127.0.0.1:{port}")
        await asyncio.wait_for(RawProbeClient(port).run(), RUN_TIMEOUT_S)
        return await trainer.finished(timeout=RUN_TIMEOUT_S)

    return asyncio.run(scenario())


def test_a_client_with_a_1_mib_frame_limit_fails_large_metadata() -> None:
    async def capped(uri: str) -> None:
        async with connect(uri, compression=None, max_size=1 << 20) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.sent is not None and closed.value.sent.code == 1009

    report = run_after_one_connection(fast(script=("stop",)), capped)
    assert failed(report) == {LARGE_METADATA}, report.text()
    assert report.clause(LARGE_METADATA).passed == 1  # the correct client's connection
    assert "connection 1: the client closed (code 1009" in details(report, LARGE_METADATA)


def test_a_client_that_connects_and_leaves_after_the_metadata_fails_no_empty_connections() -> None:
    # (what plugrl-probe once did to learn the trainer's width: PlugRL's conformance checker fails it too)
    async def leaves(uri: str) -> None:
        async with connect(uri, compression=None, max_size=None) as ws:
            await ws.recv()
            await ws.close(1000)

    report = run_after_one_connection(fast(script=("stop",)), leaves)
    assert failed(report) == {NO_EMPTY_CONNECTIONS}, report.text()
    assert "connection 1: the client closed it (code 1000" in details(report, NO_EMPTY_CONNECTIONS)
    assert report.clause(NO_EMPTY_CONNECTIONS).passed == 1  # the correct client's connection
    # it sent nothing, so whether it could take the large metadata is not judged on it
    assert any("connection 1: the client stopped (1000) right after the metadata" in n for n in report.notes)


def test_env_indices_beyond_n_envs_fail_env_sets() -> None:
    report, _ = run_client(fast(script=("stop",), n_envs=2), n_envs=3)
    assert failed(report) == {ENV_SETS}, report.text()
    assert "not below n_envs 2" in details(report, ENV_SETS)


def test_without_probe_the_probe_clauses_are_not_exercised() -> None:
    report, _ = run_client(fast(script=("stop",), probe=False))
    assert report.failed == 0, report.text()
    for clause in (CHUNK_LENGTH, REWARD_SUM, TERMINAL_OBSERVATION, TIME_MAJOR, RESET_OBSERVATION, INFO_EPISODE):
        assert report.clause(clause).status == "not exercised", clause


def test_an_info_that_cannot_be_split_per_env_fails_info_episode_with_or_without_the_probe() -> None:
    # chunks of 2 steps: the first feedback carries both envs (their episodes end at t 3 and 5)
    report, _ = run_client(fast(script=("stop",), probe=False, horizon=2), faults={"info-unsplittable"})
    assert failed(report) == {INFO_EPISODE}, report.text()
    assert "cannot be split per env" in details(report, INFO_EPISODE)
    report, _ = run_client(fast(script=("stop",), horizon=2), faults={"info-unsplittable"})
    assert failed(report) == {INFO_EPISODE}, report.text()
    assert "no info['episode'] map" in details(report, INFO_EPISODE)


def test_ending_the_run_early_reports_what_was_seen() -> None:
    trainer = TrainerThread(TestTrainer(fast(script=("stop",))))
    trainer.start()
    trainer.end()
    report = trainer.result(RUN_TIMEOUT_S)
    assert report.incomplete == "the run was ended before its script finished"
    assert report.connections == 0 and report.failed == 0


def test_a_client_that_leaves_mid_script_leaves_the_report_incomplete() -> None:
    report, ending = run_client(fast(script=("resync", "stop"), reconnect_window_s=0.2), stop_after=2)
    assert ending == "done"
    assert report.incomplete is not None and "resync, stop" in report.incomplete
    assert "script incomplete" in report.text()
    assert report.clause(RECONNECTS).status == "not exercised"


# -- settings, report, command line ---------------------------------------------------------


@pytest.mark.parametrize(
    "script",
    [(), ("resync",), ("stop", "resync"), ("text", "stop"), ("explode", "stop")],
)
def test_a_script_that_cannot_end_the_run_is_refused(script: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="script"):
        TrainerSettings(script=script)


def test_a_clause_with_no_checks_is_not_exercised_and_not_counted() -> None:
    report = TestTrainer(fast()).report
    assert all(c.status == "not exercised" for c in report.clauses)
    assert [c.name for c in report.clauses] == list(CLAUSES)
    assert report.text().splitlines()[-1] == "0 passed, 0 failed"


def test_cli_reports_and_exits_zero_for_a_correct_client() -> None:
    command = executables.command(
        "plugrl_ros.tools.test_trainer",
        "--port",
        "0",
        "--script",
        "drop,stop",
        "--feedbacks",
        "2",
        "--metadata-delay",
        "0.05",
        "--grace",
        "0.3",
        "--timeout",
        "20",
    )
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.fullmatch(r"listening on ws://127\.0\.0\.1:(\d+)\n", first)
        assert match, first
        ending = asyncio.run(asyncio.wait_for(RawProbeClient(int(match.group(1))).run(), RUN_TIMEOUT_S))
        rest, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    assert ending == "stop"
    assert proc.returncode == 0, rest
    assert re.fullmatch(r"\d+ passed, 0 failed", rest.strip().splitlines()[-1]), rest
    assert "PASS  close.reconnects" in rest


def test_cli_prints_the_report_and_exits_2_when_its_timeout_expires(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--port", "0", "--script", "stop", "--metadata-delay", "0.05", "--timeout", "0.2"])
    out = capsys.readouterr().out
    assert code == 2
    assert out.startswith("listening on ws://127.0.0.1:")
    assert "did not end within 0.2 s" in out
    assert out.strip().splitlines()[-1] == "0 passed, 0 failed"


def test_cli_refuses_a_bad_script_with_exit_code_2() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--script", "stop,resync"])
    assert exited.value.code == 2


def test_a_client_info_key_the_probe_does_not_know_passes_when_it_splits_per_env() -> None:
    """A bridge with a person in the loop sends info["intervention"] on every feedback: legal, and ignored."""
    report, _ = run_client(fast(script=("stop",), horizon=2), faults={"info-intervention"})
    assert not failed(report), report.text()
