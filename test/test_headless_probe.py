"""The headless probe against the test trainer: the client stack passes every scenario, and bugs are caught.

The probe runs the real rollout core and websocket client in-process; the
trainer is the protocol-checking test trainer on the same event loop, over
real loopback websockets.
"""

from __future__ import annotations

import asyncio
import subprocess

import numpy as np
import pytest
from harness import python_module, ros_env

from plugrl_ros.protocol import codec
from plugrl_ros.protocol.client import ClientSettings, Connected, FrameReceived
from plugrl_ros.rollout.env_rollout import EnvRollout
from plugrl_ros.tools.headless_probe import HeadlessProbe, HeadlessSettings
from plugrl_ros.tools.probe_env import ProbeEnvs
from plugrl_ros.tools.test_trainer import (
    CLAUSES,
    RECONNECTS,
    RESET_OBSERVATION,
    REWARD_SUM,
    TERMINAL_OBSERVATION,
    TIME_MAJOR,
    WAITS_FOR_METADATA,
    Report,
    TestTrainer,
    TrainerSettings,
)

pytestmark = [pytest.mark.websockets]


def settings(**overrides: object) -> TrainerSettings:
    values: dict = {
        "port": 0,
        "script": ("resync", "timeout", "crash", "drop", "stop"),
        "feedbacks_per_connection": 6,
        "metadata_delay_s": 0.05,
        "grace_s": 0.3,
        "reconnect_window_s": 5.0,
    }
    values.update(overrides)
    return TrainerSettings(**values)


def client(port: int) -> ClientSettings:
    return ClientSettings(uri=f"ws://127.0.0.1:{port}", reconnect_initial_s=0.05, reconnect_max_s=0.2)


async def _run(trainer_settings: TrainerSettings, make_probe) -> tuple[Report, int]:
    trainer = TestTrainer(trainer_settings)
    port = await trainer.start()
    probe = make_probe(port)
    code = await asyncio.wait_for(probe.run(), 60)
    report = await trainer.finished(30)
    return report, code


def run(trainer_settings: TrainerSettings, make_probe) -> tuple[Report, int]:
    return asyncio.run(_run(trainer_settings, make_probe))


def failed(report: Report) -> set[str]:
    return {name for name in CLAUSES if report.clause(name).failures}


@pytest.mark.parametrize(
    ("n_envs", "horizon", "dtype", "reuse"),
    [
        (1, 1, "<f4", True),
        (2, 2, "<f8", False),
        (3, 3, "<f4", False),
        (4, 4, "<f8", True),
        (5, 5, "<f4", True),
        (6, 6, "<f8", False),
        (7, 7, "<f4", True),
        (7, 8, "<f8", False),
        (3, 8, "<f4", True),
        (1, 5, "<f8", True),
    ],
)
def test_the_client_stack_passes_every_scenario(n_envs, horizon, dtype, reuse):
    features = ("reuse-feedback-obs",) if reuse else ()
    trainer = settings(horizon=horizon, action_dtype=dtype, features=features, n_envs=n_envs, action_dim=3)
    probes: list[_CountsReuse] = []

    def make(port: int) -> HeadlessProbe:
        probes.append(_CountsReuse(HeadlessSettings(client(port), n_envs=n_envs)))
        return probes[0]

    report, code = run(trainer, make)
    assert code == 0
    assert report.failed == 0, report.text()
    assert not report.incomplete, report.text()
    for clause in (REWARD_SUM, TERMINAL_OBSERVATION, TIME_MAJOR, RESET_OBSERVATION, RECONNECTS):
        assert report.clause(clause).passed > 0, clause
    # an episode longer than one chunk ends a chunk without ending the episode: its observation is reused
    spans_chunks = any(3 + 2 * (i % 3) > horizon for i in range(n_envs))
    assert (probes[0].reused_rows > 0) == (reuse and spans_chunks)


class _CountsReuse(HeadlessProbe):
    """Counts the infer rows sent as reused (the observation crossed only in the feedback)."""

    reused_rows = 0

    def _advance(self, epoch):
        original = self.client.send

        def spy(epoch_, outgoing):
            if outgoing.kind == "infer":
                reuse = outgoing.message().get("reuse")
                self.reused_rows += 0 if reuse is None else int(reuse.sum())
            return original(epoch_, outgoing)

        self.client.send = spy
        try:
            super()._advance(epoch)
        finally:
            self.client.send = original


def test_a_text_frame_ends_the_probe_with_a_failure_status():
    report, code = run(
        settings(script=("resync", "text")), lambda port: HeadlessProbe(HeadlessSettings(client(port), n_envs=3))
    )
    assert code != 0
    assert report.failed == 0, report.text()


def test_without_announced_action_dim_the_probe_needs_it_given():
    trainer = settings(script=("stop",), announce_shape=False, action_dim=2)
    report, code = run(trainer, lambda port: HeadlessProbe(HeadlessSettings(client(port), n_envs=2, action_dim=2)))
    assert code == 0 and report.failed == 0, report.text()


def test_client_side_truncation_and_replanning_are_accepted():
    trainer = settings(script=("resync", "stop"), horizon=6)
    report, code = run(
        trainer,
        lambda port: HeadlessProbe(HeadlessSettings(client(port), n_envs=4, replan_steps=2, max_episode_steps=4)),
    )
    assert code == 0 and report.failed == 0, report.text()


# -- deliberate client bugs, each caught by its clause ------------------------


class _LastStepReward(EnvRollout):
    def finish_step(self, reward, *args, **kwargs):
        self.chunk_reward = 0.0  # forget the earlier steps: feedback carries only the last step's reward
        return super().finish_step(reward, *args, **kwargs)


class _ResetInsideStep(ProbeEnvs):
    def step(self, env, action):
        reward, terminated = super().step(env, action)
        if terminated:
            self.reset(env)  # the terminal observation is lost
        return reward, terminated


class _EnvMajor(HeadlessProbe):
    def on_event(self, event):
        if isinstance(event, FrameReceived) and self.rollout.connection is not None:
            message = codec.unpackb(event.frame)
            if message.get("message_type") == "action":
                action = message["data"]["action"]
                h, n = action.shape[:2]
                # read the buffer as [n, H, d] (env-major), re-expressed time-major
                message["data"]["action"] = np.ascontiguousarray(action.reshape(n, h, -1).transpose(1, 0, 2))
                event = FrameReceived(event.epoch, codec.packb(message))
        super().on_event(event)


class _SpeaksFirst(HeadlessProbe):
    def on_event(self, event):
        super().on_event(event)
        if isinstance(event, Connected):
            from plugrl_ros.protocol.connection import Outgoing

            infer = {"message_type": "infer", "data": {}, "env_indices": np.zeros(0, "<i8")}
            self.client.send(event.epoch, Outgoing("infer", (), lambda: infer))


class _FeedbackAfterReconnect(HeadlessProbe):
    last_feedback = None

    def _on_frame(self, event):
        if self.rollout.metadata is None and self.last_feedback is not None:
            # the new connection's metadata: send the feedback held across the
            # close before anything else (what the epoch check prevents)
            self.client.send(event.epoch, self.last_feedback)
            type(self).last_feedback = None
        super()._on_frame(event)

    def _advance(self, epoch):
        original = self.client.send

        def spy(epoch_, outgoing):
            if outgoing.kind == "feedback":
                type(self).last_feedback = outgoing
            return original(epoch_, outgoing)

        self.client.send = spy
        try:
            super()._advance(epoch)
        finally:
            self.client.send = original


def _with_env_rollouts(probe: HeadlessProbe, cls: type) -> HeadlessProbe:
    for env in probe.rollout.envs:
        env.__class__ = cls
    return probe


@pytest.mark.parametrize(
    ("bug", "clause"),
    [
        ("last-step reward", REWARD_SUM),
        ("env-major action", TIME_MAJOR),
        ("reset inside the step", TERMINAL_OBSERVATION),
        ("speaking before metadata", WAITS_FOR_METADATA),
        ("feedback after reconnect", RECONNECTS),
    ],
)
def test_each_deliberate_client_bug_is_caught_by_its_clause(bug, clause):
    def make(port: int) -> HeadlessProbe:
        s = HeadlessSettings(client(port), n_envs=3)
        if bug == "last-step reward":
            return _with_env_rollouts(HeadlessProbe(s), _LastStepReward)
        if bug == "env-major action":
            return _EnvMajor(s)
        if bug == "reset inside the step":
            return HeadlessProbe(s, make_envs=_ResetInsideStep)
        if bug == "speaking before metadata":
            return _SpeaksFirst(s)
        return _FeedbackAfterReconnect(s)

    _FeedbackAfterReconnect.last_feedback = None
    report, _ = run(settings(script=("resync", "stop"), horizon=4), make)
    assert clause in failed(report), report.text()


def test_the_command_exits_0_after_stop_and_by_itself_after_steps():
    async def scenario(script, extra):
        trainer = TestTrainer(settings(script=script))
        port = await trainer.start()
        command = python_module("plugrl_ros.tools.probe", "--headless", "--envs", "2", "--quiet")
        proc = await asyncio.create_subprocess_exec(
            *command, "--server", f"ws://127.0.0.1:{port}", *extra, env=ros_env(), stderr=subprocess.PIPE
        )
        _, stderr = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode, await trainer.finished(30), stderr.decode()

    code, report, stderr = asyncio.run(scenario(("resync", "stop"), []))
    assert code == 0, stderr
    assert report.failed == 0, report.text()
    code, report, stderr = asyncio.run(scenario(("serve",), ["--steps", "10"]))
    assert code == 0, stderr
    assert report.failed == 0, report.text()
    assert not any("1000" in note for note in report.notes), report.notes  # it closed with 1000
    code, report, _ = asyncio.run(scenario(("text",), []))
    assert code == 1


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--api-key-env", "PLUGRL_TEST_UNSET_KEY"], "--api-key-env: the environment variable PLUGRL_TEST_UNSET_KEY"),
        (["--ca-file", "/nonexistent/plugrl-ca.pem"], "--ca-file /nonexistent/plugrl-ca.pem: cannot load it as a CA"),
    ],
)
def test_the_command_refuses_what_it_could_never_connect_with(option, says):
    env = {k: v for k, v in ros_env().items() if k != "PLUGRL_TEST_UNSET_KEY"}
    command = python_module("plugrl_ros.tools.probe", "--headless", "--server", "wss://127.0.0.1:9", *option)
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
