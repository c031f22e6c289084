"""PlugRLEnvRunner over real websockets: infers answered by RLlib's pipelines, feedback made into RLlib episodes.

A scripted client plays a bridge message by message; ``sample()`` runs on a
thread as Ray runs it on the actor's. No ROS here: the bridge and the demo
robots drive the runner in test_rllib_bridge.py.
"""

from __future__ import annotations

import asyncio
import sys
import time

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from rllib_client import ACTION_HIGH, ACTION_LOW, POISON, WAIT_S, connected, make_runner, ppo_config, run, sampling

from plugrl_ros.protocol.client import RESYNC_REASON, STOP_REASON
from plugrl_ros.protocol.messages import episode_info
from plugrl_ros.rllib import PlugRLEnvRunner
from plugrl_ros.rllib.env_runner import ServerDied

pytestmark = [pytest.mark.rllib, pytest.mark.ros, pytest.mark.websockets]

from ray.rllib.core.columns import Columns  # noqa: E402
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO  # noqa: E402
from ray.rllib.utils.spaces.space_utils import unsquash_action  # noqa: E402


@pytest.fixture
def runner():
    made = []

    def make(**kwargs):
        made.append(make_runner(**kwargs))
        return made[-1]

    yield make
    for r in made:
        r.stop()


def test_the_metadata_announces_the_chunk_and_offers_reuse(runner):
    r = runner(horizon=3)

    async def scenario() -> dict:
        client = await connected(r.port)
        await client.ws.close()
        return client.metadata

    metadata = run(scenario)
    assert metadata["action_horizon"] == 3 and metadata["action_dim"] == 2
    assert metadata["features"] == ["reuse-feedback-obs"] and metadata["protocol_version"] == 1
    assert "PPO" in metadata["algorithm"]


def test_feedback_becomes_episodes_with_the_sampled_actions_their_logp_and_the_terminal_observation(runner):
    r = runner(horizon=2)
    space = r.action_space

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=3)
        first = await client.infer([0, 1], [[0.0, 0.1, 0.2], [1.0, 1.1, 1.2]])
        ended = episode_info([False, True], [0.0, 2.0], [0, 2], [False, True])
        await client.feedback([0, 1], [[0.5, 0.5, 0.5], [9.0, 9.0, 9.0]], [1.0, 2.0], [False, True], info=ended)
        second = await client.infer([0], [], reuse=[True])  # env 0 continues from its feedback's observation
        await client.feedback([0], [[0.7, 0.7, 0.7]], [3.0])
        episodes = await sample
        await client.ws.close()
        return first, second, episodes

    first, second, episodes = run(scenario)
    assert first.shape == (2, 2, 2) and first.dtype.str == "<f4"  # [H, n, action_dim], time-major
    assert len(episodes) == 2
    done = next(e for e in episodes if e.is_done)
    running = next(e for e in episodes if not e.is_done)
    # the ended episode: reset observation, one RL step to the terminal observation, the bridge's count
    assert done.is_terminated and len(done) == 1 and done.get_return() == 2.0
    assert done.get_observations(0).tolist() == pytest.approx([1.0, 1.1, 1.2])
    assert done.get_observations(-1).tolist() == [9.0, 9.0, 9.0]
    assert done.get_infos(-1) == {"episode": {"r": 2.0, "l": 2, "s": True}}
    # the running one: two RL steps (chunks), each reward the chunk's sum as fed back
    assert len(running) == 2 and running.get_rewards().tolist() == [1.0, 3.0]
    assert np.allclose(running.get_observations(), [[0, 0.1, 0.2], [0.5] * 3, [0.7] * 3])
    # what the robots got: the stored (sampled) action, unsquashed into the action space by RLlib's connector
    for episode, chunk, row in ((done, first, 1), (running, first, 0)):
        action = episode.get_actions(0)
        assert action.shape == (4,)  # the whole chunk, flattened
        expected = unsquash_action(action, space).reshape(2, 2)
        assert np.allclose(chunk[:, row, :], expected, atol=1e-6)
        assert ACTION_LOW <= chunk.min() and chunk.max() <= ACTION_HIGH
    assert np.allclose(second[:, 0, :], unsquash_action(running.get_actions(1), space).reshape(2, 2), atol=1e-6)
    # each step keeps the logp of its action and the distribution inputs it was drawn from
    outputs = running.get_extra_model_outputs(Columns.ACTION_LOGP)
    inputs = running.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS)
    assert len(outputs) == 2 and inputs.shape == (2, 8)  # a diagonal Gaussian: mean and log std per value
    dist = r.module.get_exploration_action_dist_cls().from_logits(_tensor(inputs))
    assert np.allclose(dist.logp(_tensor(running.get_actions())).numpy(), outputs, atol=1e-4)
    assert running.get_extra_model_outputs(WEIGHTS_SEQ_NO).tolist() == [0, 0]


def _tensor(array):
    import torch

    return torch.as_tensor(np.asarray(array, dtype=np.float32))


def test_a_running_episode_is_cut_at_the_end_of_a_sample_and_continues_with_lookback(runner):
    r = runner()

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=2)
        await client.infer([0], [[1.0, 1.0, 1.0]])
        await client.feedback([0], [[2.0, 2.0, 2.0]], [1.0])
        await client.infer([0], [[2.0, 2.0, 2.0]])  # no reuse: the bridge sends the feedback's row again
        await client.feedback([0], [[3.0, 3.0, 3.0]], [1.0])
        first = await sample
        await client.send_infer([0], [[3.0, 3.0, 3.0]])
        sample = await sampling(r, num_timesteps=1)
        await client.action([0])
        await client.feedback([0], [[4.0, 4.0, 4.0]], [5.0], truncated=[True])
        second = await sample
        await client.ws.close()
        return first, second

    first, second = run(scenario)
    assert len(first) == 1 and len(second) == 1
    before, after = first[0], second[0]
    assert before.id_ == after.id_ and not before.is_done and after.is_truncated
    assert len(before) == 2 and len(after) == 1 and after.t_started == 2
    assert after.get_observations().tolist() == [[3.0] * 3, [4.0] * 3]
    # episode_lookback_horizon (1): the step before the cut is still visible to connectors
    assert after.get_observations(-1, neg_index_as_lookback=True).tolist() == [2.0] * 3
    assert after.get_rewards(-1, neg_index_as_lookback=True) == 1.0


def test_a_fresh_observation_after_a_feedback_is_acted_on_and_the_old_chunk_ends_unterminated(runner):
    """A bridge paused with a feedback held sends it not ended, and on resume an infer with the robot's new
    observation: the action must come from that row, and no transition from the old one may be stored."""
    r = runner()

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=2)
        await client.infer([0], [[0.0] * 3])
        await client.feedback([0], [[1.0] * 3], [1.0])
        await client.infer([0], [[5.0] * 3])  # the robot moved on while the bridge was paused
        ended = episode_info([True], [3.0], [9], [True])
        await client.feedback([0], [[6.0] * 3], [2.0], terminated=[True], info=ended)
        episodes = await sample
        metrics = r.get_metrics()
        await client.ws.close()
        return episodes, metrics

    episodes, metrics = run(scenario)
    before = next(e for e in episodes if not e.is_done)
    after = next(e for e in episodes if e.is_done)
    assert len(episodes) == 2 and before.id_ != after.id_
    # the old chunk: the step that happened, from 0 to 1, left for RLlib to bootstrap
    assert not before.is_terminated and not before.is_truncated
    assert before.get_observations().tolist() == [[0.0] * 3, [1.0] * 3] and before.get_rewards().tolist() == [1.0]
    # the new episode starts at the fresh row, and its action was computed from it
    assert after.get_observations().tolist() == [[5.0] * 3, [6.0] * 3]
    assert np.allclose(after.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS, 0), _dist_inputs(r, [5.0] * 3))
    # the robot's episode is one episode in the metrics, as the bridge counts it
    assert float(metrics["num_episodes"]) == 1
    assert float(metrics["episode_len_mean"]) == 2 and float(metrics["episode_return_mean"]) == pytest.approx(3.0)


def _dist_inputs(r, observation: list[float]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = r.module.forward_inference({Columns.OBS: _tensor([observation])})
    return out[Columns.ACTION_DIST_INPUTS].numpy()[0]


def test_sample_returns_within_its_wait_when_no_robot_is_connected(runner):
    r = runner(sample_wait_s=0.5)
    started = time.monotonic()
    assert r.sample(num_timesteps=100) == []
    assert time.monotonic() - started < 5.0  # the wait is 0.5 s; the bound is a hang guard
    metrics = r.get_metrics()
    assert float(metrics["num_env_steps_sampled"]) == 0
    assert float(metrics["plugrl"]["robots_connected"]) == 0


def test_a_sample_whose_wait_ends_with_an_action_in_flight_returns_and_the_next_one_takes_its_feedback(runner):
    r = runner(sample_wait_s=1.0)

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=5)
        await client.infer([0], [[0.0] * 3])
        await client.feedback([0], [[1.0] * 3], [1.0])
        await client.infer([0], [], reuse=[True])  # answered; its feedback comes after the wait is over
        first = await sample
        sample = await sampling(r, num_timesteps=1)
        await client.feedback([0], [[2.0] * 3], [2.0])
        second = await sample
        await client.ws.close()
        return first, second

    first, second = run(scenario)
    # the wait ended with one step fed back and the robot still acting: that step is returned, cut
    assert [len(e) for e in first] == [1] and not first[0].is_done
    # the late feedback is the next call's step, in the same episode
    assert [len(e) for e in second] == [1] and second[0].id_ == first[0].id_
    assert second[0].get_rewards().tolist() == [2.0]


def test_an_infer_held_back_while_draining_whose_bridge_leaves_is_forgotten(runner, caplog):
    """With on-policy timing, an infer that arrives after a sample has its steps waits for the next call;
    if its bridge leaves meanwhile, the next call must not try to answer it."""
    r = runner(sample_wait_s=10.0)

    async def scenario():
        a, b = await connected(r.port), await connected(r.port)
        sample = await sampling(r, num_timesteps=1)
        await b.infer([0], [[5.0] * 3])  # b holds an action: the call drains until b's feedback
        await a.infer([0], [[0.0] * 3])
        await a.feedback([0], [[1.0] * 3], [1.0])  # the call has its step
        await a.send_infer([0], [], reuse=[True])  # held back for the next call
        await a.ws.close()
        deadline = time.monotonic() + WAIT_S
        while r.figures.bridges != 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # a's close is queued (before anything b sends from now on)
        await b.feedback([0], [[6.0] * 3], [1.0])
        first = await sample
        sample = await sampling(r, num_timesteps=1)
        await b.infer([0], [], reuse=[True])
        await b.feedback([0], [[7.0] * 3], [1.0])
        second = await sample
        await b.ws.close()
        return first, second

    first, second = run(scenario)
    assert sorted(len(e) for e in first) == [1, 1] and [len(e) for e in second] == [1]
    assert not [record for record in caplog.records if record.levelname == "ERROR"]


def test_on_policy_a_robot_waits_for_its_action_until_the_next_sample(runner):
    r = runner(sample_wait_s=2.0)

    async def scenario() -> tuple[bool, float]:
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=1)
        await client.infer([0], [[0.0, 0.0, 0.0]])
        await client.feedback([0], [[1.0, 1.0, 1.0]], [0.0])
        await sample  # the learner would update now
        await client.send_infer([0], [[1.0, 1.0, 1.0]])
        try:
            await asyncio.wait_for(client.ws.recv(), 1.0)
            answered_while_learning = True
        except asyncio.TimeoutError:
            answered_while_learning = False
        sample = await sampling(r, num_timesteps=1)
        action = await client.action([0])  # the next sample answers it
        await client.feedback([0], [[2.0, 2.0, 2.0]], [0.0])
        await sample
        await client.ws.close()
        return answered_while_learning, float(np.abs(action).sum())

    answered_while_learning, _ = run(scenario)
    assert not answered_while_learning
    share = float(r.get_metrics()["plugrl"]["robot_idle_share"])
    assert 0.0 < share <= 1.0


def test_serving_during_updates_answers_without_a_sample_and_counts_the_steps_for_the_next(runner):
    r = runner(serve_during_updates=True, sample_wait_s=2.0)

    async def scenario() -> list:
        client = await connected(r.port)
        for k in range(3):
            await client.infer([0], [[float(k)] * 3])
            await client.feedback([0], [[k + 1.0] * 3], [1.0])
        episodes = await asyncio.get_running_loop().run_in_executor(None, lambda: r.sample(num_timesteps=3))
        await client.ws.close()
        return episodes

    episodes = run(scenario)
    assert sum(len(e) for e in episodes) == 3


def test_serving_during_updates_shortens_the_interpreters_switch_interval_and_only_then(runner):
    default = sys.getswitchinterval()
    try:
        runner(serve_during_updates=False)
        assert sys.getswitchinterval() == default
        runner(serve_during_updates=True, switch_interval_s=None)
        assert sys.getswitchinterval() == default
        runner(serve_during_updates=True)  # the answers wait at most 0.5 ms for the lock, not 5 ms
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        runner(serve_during_updates=True, switch_interval_s=0.002)  # lowered only, never raised
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(default)


@pytest.mark.parametrize("asked", ["explore=False", "random_actions=True"])
def test_serving_during_updates_answers_as_the_waiting_sample_call_asks(runner, asked):
    r = runner(serve_during_updates=True, sample_wait_s=5.0)
    kwargs = {"explore": False} if asked == "explore=False" else {"random_actions": True}

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=1, **kwargs)
        deadline = time.monotonic() + WAIT_S
        while r._explore and r._random_actions is False and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # until the call has taken its settings (its wait has begun)
        await client.infer([0], [[0.5] * 3])
        await client.feedback([0], [[1.0] * 3], [1.0])
        (episode,) = await sample
        await client.ws.close()
        return episode

    episode = run(scenario)
    if asked == "explore=False":
        # no sampling: the action is the distribution's mean (the first half of a Gaussian's inputs)
        means = _dist_inputs(r, [0.5] * 3)[:2]
        assert np.allclose(episode.get_actions(0), means, atol=1e-5)
    else:
        # drawn from the action space, not by the RLModule: no distribution inputs recorded with it
        assert Columns.ACTION_DIST_INPUTS not in episode.extra_model_outputs
    assert r._explore is True and r._random_actions is False  # between calls: the config's


def test_a_frame_unlike_the_spaces_closes_that_connection_for_a_resync_and_the_others_go_on(runner):
    r = runner()

    async def scenario():
        good, bad = await connected(r.port), await connected(r.port)
        sample = await sampling(r, num_timesteps=2)
        await bad.send_infer([0], [[1.0, 2.0, 3.0, 4.0, 5.0]])  # five values where the space declares three
        bad_close = await bad.closed()
        await good.infer([0], [[0.0] * 3])
        await good.feedback([0], [[1.0] * 3], [1.0])
        await good.infer([0], [[1.0] * 3])
        await good.feedback([0], [[2.0] * 3], [1.0])
        episodes = await sample
        await good.ws.close()
        return bad_close, episodes

    bad_close, episodes = run(scenario)
    assert bad_close == (1001, RESYNC_REASON)
    assert [len(e) for e in episodes] == [2]


@pytest.mark.parametrize("serve_during_updates", [False, True])
def test_a_failure_on_one_bridges_message_closes_only_that_connection_and_the_runner_serves_on(
    runner, caplog, serve_during_updates
):
    r = runner(poison=True, serve_during_updates=serve_during_updates, sample_wait_s=10.0)

    async def scenario():
        good, bad = await connected(r.port), await connected(r.port)
        sample = await sampling(r, num_timesteps=2)
        await bad.infer([0], [[0.0] * 3])
        await bad.feedback([0], [[POISON] * 3], [1.0])  # the user's connector raises on this observation
        bad_close = await bad.closed()
        for k in range(2):
            await good.infer([0], [[float(k)] * 3])
            await good.feedback([0], [[k + 1.0] * 3], [1.0])
        episodes = await sample
        r.assert_healthy()
        # and the next call answers as usual
        sample = await sampling(r, num_timesteps=1)
        await good.infer([0], [], reuse=[True])
        await good.feedback([0], [[3.0] * 3], [1.0])
        more = await sample
        await good.ws.close()
        return bad_close, episodes, more

    bad_close, episodes, more = run(scenario)
    assert bad_close == (1001, RESYNC_REASON)
    # only the good bridge's steps: the failed connection's half-handled episode never reaches the learner
    assert [e.get_observations(0).tolist() for e in episodes] == [[0.0] * 3] and len(episodes[0]) == 2
    assert sum(len(e) for e in more) == 1
    assert any("bridge 1's FedBack failed" in record.getMessage() for record in caplog.records)


def test_a_closed_connection_keeps_its_fed_back_steps_as_a_chunk_that_never_continues(runner):
    r = runner(sample_wait_s=2.0)

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=10)
        await client.infer([0, 1], [[0.0] * 3, [1.0] * 3])
        await client.feedback([0, 1], [[0.5] * 3, [1.5] * 3], [1.0, 1.0])
        await client.infer([0], [], reuse=[True])  # env 0's action is in flight when the bridge goes
        await client.ws.close()
        return await sample

    episodes = run(scenario)
    assert sorted(len(e) for e in episodes) == [1, 1]
    assert not any(e.is_done for e in episodes)
    assert float(r.get_metrics()["plugrl"]["bridges_connected"]) == 0

    # and the runner forgot that connection: a new one starts a fresh episode with env 0 again
    async def again():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=1)
        await client.infer([0], [[7.0] * 3])  # a reused row would be refused: nothing carries over
        await client.feedback([0], [[8.0] * 3], [1.0])
        fresh = await sample
        await client.ws.close()
        return fresh

    (fresh,) = run(again)
    assert fresh.id_ not in {e.id_ for e in episodes} and fresh.t_started == 0
    assert fresh.get_observations().tolist() == [[7.0] * 3, [8.0] * 3]


def test_newer_weights_are_taken_older_ones_ignored_and_each_step_records_its_weights_number(runner):
    source, r = runner(), runner()
    weights = source.get_state()
    weights["weights_seq_no"] = 3
    r.set_state(weights)
    assert r.get_state()["weights_seq_no"] == 3
    old = dict(runner().get_state(), weights_seq_no=2)  # other initial weights, an older number
    r.set_state(old)
    mine = r.get_state()["rl_module"]
    for key, value in weights["rl_module"].items():
        assert np.array_equal(np.asarray(mine[key]), np.asarray(value)), key

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=1)
        await client.infer([0], [[0.0] * 3])
        await client.feedback([0], [[1.0] * 3], [1.0])
        episodes = await sample
        await client.ws.close()
        return episodes

    (episode,) = run(scenario)
    # as RLlib's own runner: the number follows the last state given, the weights only newer ones
    assert episode.get_extra_model_outputs(WEIGHTS_SEQ_NO).tolist() == [r.get_state()["weights_seq_no"]]


def test_metrics_count_episodes_steps_and_the_link(runner):
    r = runner()

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=4)
        for step in range(4):
            ended = step % 2 == 1
            await client.infer([0], [[float(step)] * 3])
            info = episode_info([ended], [2.0], [2], [ended and step == 3]) if ended else None
            await client.feedback([0], [[step + 0.5] * 3], [1.0], terminated=[ended], info=info)
        await sample
        metrics = r.get_metrics()
        await client.ws.close()
        return metrics

    metrics = run(scenario)
    value = lambda key, group=metrics: float(group[key])  # noqa: E731 (a runner's metrics are Stats to merge)
    assert value("num_env_steps_sampled") == 4 and value("num_episodes") == 2
    assert value("episode_return_mean") == pytest.approx(2.0) and value("episode_len_mean") == pytest.approx(2.0)
    link = metrics["plugrl"]
    assert value("robots_connected", link) == 1 and value("bridges_connected", link) == 1
    assert value("episode_success_mean", link) == pytest.approx(0.5) and value("episode_control_steps_mean", link) == 2
    assert value("infer_round_trip_ms", link) > 0 and value("inference_ms_per_row", link) > 0
    assert [e.ret for e in r.episode_log] == [2.0, 2.0]


def test_stop_ends_the_run_for_every_bridge_with_plugrl_server_stop(runner):
    r = runner()

    async def scenario():
        clients = [await connected(r.port) for _ in range(2)]
        await asyncio.get_running_loop().run_in_executor(None, r.stop)
        return [await c.closed() for c in clients]

    assert run(scenario) == [(1001, STOP_REASON)] * 2
    with pytest.raises(RuntimeError, match="stopped"):
        r.sample(num_timesteps=1)


def test_the_feedback_bound_closes_a_silent_connection(runner):
    r = runner(feedback_timeout_s=0.5)

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=1)
        await client.infer([0], [[0.0] * 3])
        closed = await client.closed(WAIT_S)  # no feedback: the runner gives up after 0.5 s
        await sample
        return closed

    assert run(scenario) == (1001, "Feedback timeout")


def test_a_port_already_taken_is_an_error_naming_the_runner_and_the_setting(runner):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf'runner 0 cannot listen on 127\.0\.0\.1:{port}.*\["port"\] \+ i'):
            runner(port=port)


def test_an_evaluation_runner_without_an_evaluation_port_is_refused_naming_the_settings():
    # what RLlib gives its evaluation runners once evaluation_interval is set: worker indices like the
    # training runners', and the same env_config (the local one listened on port + 0, as training's does)
    config = ppo_config().evaluation(evaluation_interval=1).get_evaluation_config_object()
    with pytest.raises(
        ValueError, match=r'evaluation runner 0: env_config\["plugrl"\]\["evaluation_port"\].*evaluation_interval'
    ):
        PlugRLEnvRunner(config=config)


def test_evaluation_runners_listen_on_their_own_ports(runner):
    import socket

    training = runner()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = ppo_config(evaluation_port=port).evaluation(evaluation_interval=1).get_evaluation_config_object()
        with pytest.raises(
            OSError, match=rf'evaluation runner 0 cannot listen on 127\.0\.0\.1:{port}.*\["evaluation_port"\] \+ i'
        ):
            PlugRLEnvRunner(config=config)
    config = ppo_config(evaluation_port=0).evaluation(evaluation_interval=1).get_evaluation_config_object()
    evaluating = PlugRLEnvRunner(config=config)
    try:
        assert evaluating.evaluation and evaluating.port not in (None, training.port)

        async def scenario() -> dict:
            client = await connected(evaluating.port)
            await client.ws.close()
            return client.metadata

        assert run(scenario)["action_dim"] == 2
    finally:
        evaluating.stop()


def test_a_bridge_server_that_dies_fails_sample_and_is_logged_with_its_traceback(runner, caplog):
    """A runner whose server thread died must not sample nothing for ever: RLlib must see it fail."""
    r = runner(sample_wait_s=0.5)
    server = r._server

    def planted_bug() -> None:  # the server's own close, as it ends its run, meets an error nobody expected
        raise RuntimeError("planted bug: nobody expected this")

    server._server.close = planted_bug
    server._thread.end()
    assert server._thread.join(10) and not server.listening
    with pytest.raises(ServerDied, match=r"bridge server stopped serving .*planted bug"):
        r.sample(num_timesteps=10)
    logged = [rec for rec in caplog.records if rec.levelname == "ERROR" and "stopped serving" in rec.getMessage()]
    assert logged and "Traceback (most recent call last)" in logged[0].getMessage(), caplog.text


def test_a_persons_steps_go_into_the_episode_as_executed_flagged_with_the_behaviour_logp_recomputed(runner):
    """The episode holds the person's action on exactly the steps the person commanded, in the module's space,
    every step says whether it was intervened, and the stored logp is that of the executed action."""
    from ray.rllib.utils.spaces.space_utils import normalize_action

    r = runner(horizon=2)
    space = r.action_space
    person = np.array([[0.5, -0.25]])  # what step 1 of env 0's chunk executed, in the action space

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=4)
        chunk = await client.infer([0, 1], [[0.0, 0.1, 0.2], [1.0, 1.1, 1.2]])
        executed = chunk.transpose(1, 0, 2).astype("<f4")  # [m, H, da]: the chunk's own actions ...
        executed[0, 1] = person  # ... but for the person's step
        info = {"intervention": {"active": np.array([[False, True], [False, False]]), "action": executed}}
        await client.feedback([0, 1], [[0.5] * 3, [1.5] * 3], [1.0, 2.0], info=info)
        second = await client.infer([0, 1], [], reuse=[True, True])
        info = {"intervention": {"active": np.zeros((2, 2), bool), "action": second.transpose(1, 0, 2).copy()}}
        await client.feedback([0, 1], [[0.6] * 3, [1.6] * 3], [1.0, 2.0], info=info)
        episodes = await sample
        await client.ws.close()
        return chunk, episodes

    chunk, episodes = run(scenario)
    [env0] = [e for e in episodes if e.get_observations(0)[0] == 0.0]
    [env1] = [e for e in episodes if e.get_observations(0)[0] == 1.0]
    # (infos go with observations: index 0 is the reset's, step k's is index k + 1)
    assert [env0.get_infos(i)["intervened"] for i in (1, 2)] == [True, False]
    assert [env1.get_infos(i)["intervened"] for i in (1, 2)] == [False, False]
    stored = env0.get_actions(0).reshape(2, 2)
    # step 0 ran the chunk's action as sampled; step 1 the person's, mapped into the module's space
    assert np.allclose(unsquash_action(stored[0], _step_space(space)), chunk[0, 0], atol=1e-5)
    assert np.allclose(stored[1], normalize_action(person[0].astype(np.float32), _step_space(space)), atol=1e-5)
    assert not np.allclose(unsquash_action(stored[1], _step_space(space)), chunk[1, 0], atol=1e-3)
    # the behaviour logp is the executed action's under the distribution the policy acted with
    inputs = env0.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS)
    dist = r.module.get_exploration_action_dist_cls().from_logits(_tensor(inputs))
    logp = env0.get_extra_model_outputs(Columns.ACTION_LOGP)
    assert np.allclose(dist.logp(_tensor(env0.get_actions())).numpy(), logp, atol=1e-4)
    # the runner's own steps keep theirs
    inputs1 = env1.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS)
    dist1 = r.module.get_exploration_action_dist_cls().from_logits(_tensor(inputs1))
    assert np.allclose(dist1.logp(_tensor(env1.get_actions())).numpy(), env1.get_extra_model_outputs("action_logp"))


def test_an_unreadable_intervention_info_closes_the_connection_for_a_resync(runner):
    r = runner(horizon=2)

    async def scenario():
        client = await connected(r.port)
        sample = await sampling(r, num_timesteps=2)
        await client.infer([0], [[0.0, 0.1, 0.2]])
        info = {"intervention": {"active": np.array([[True]]), "action": np.zeros((1, 1, 2), "<f4")}}  # H is 2
        await client.feedback([0], [[0.5] * 3], [1.0], info=info)
        await client.ws.wait_closed()
        await sample
        return client.ws.close_reason

    assert run(scenario) == RESYNC_REASON


def _step_space(space):
    """One control step's space out of the chunk's flat [H * action_dim] Box."""
    import gymnasium as gym

    return gym.spaces.Box(space.low[:2], space.high[:2], dtype=space.dtype)
