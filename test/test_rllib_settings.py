"""plugrl_ros.rllib.settings and link_figures: the runner's settings from env_config, and the link's figures."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.rllib")

from plugrl_ros.rllib.settings import RunnerSettings, check_against
from plugrl_ros.serve.link_figures import LinkFigures

pytestmark = [pytest.mark.rllib]


def test_settings_travel_in_env_config_and_come_back_equal():
    settings = RunnerSettings(host="0.0.0.0", port=9000, horizon=5, sample_wait_s=3.0, serve_during_updates=True)
    config = settings.env_config(mine=1)
    assert config["mine"] == 1
    assert RunnerSettings.from_env_config(config) == settings
    assert RunnerSettings.from_env_config({}) == RunnerSettings()


def test_runner_i_listens_on_port_plus_i_and_port_0_stays_a_free_port():
    assert [RunnerSettings(port=8000).port_of(i) for i in range(3)] == [8000, 8001, 8002]
    assert RunnerSettings(port=0).port_of(2) == 0
    assert RunnerSettings(port=8000, evaluation_port=9000).port_of(2, evaluation=True) == 9002
    assert RunnerSettings(evaluation_port=0).port_of(2, evaluation=True) == 0
    with pytest.raises(ValueError, match="evaluation_port"):
        RunnerSettings(port=8000).port_of(1, evaluation=True)


def test_a_site_runner_listens_on_the_sites_fixed_port_whatever_its_worker_index():
    sited = RunnerSettings(port=8000, evaluation_port=9000, site_label="plugrl-site")
    assert [sited.port_of(i) for i in range(4)] == [8000, 8000, 8000, 8000]
    assert [sited.port_of(i, evaluation=True) for i in (1, 3)] == [9000, 9000]
    assert RunnerSettings.from_env_config(sited.env_config()) == sited


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"prot": 1}, r'env_config\["plugrl"\]\["prot"\]: unknown setting'),
        ({"port": 70000}, r'\["port"\]: got 70000; expected a port'),
        ({"horizon": 0}, r'\["horizon"\]: got 0'),
        ({"sample_wait_s": -1}, r'\["sample_wait_s"\]: got -1'),
        ({"serve_during_updates": "yes"}, r'\["serve_during_updates"\]: got .yes.'),
        ({"switch_interval_s": 0}, r'\["switch_interval_s"\]: got 0; expected None or seconds in \(0, 1\]'),
        ({"site_label": ""}, r'\["site_label"\]: got \'\'; expected None or the name of a Ray node label'),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key(given, message):
    with pytest.raises(ValueError, match=message):
        RunnerSettings.from_env_config({"plugrl": given})


def test_the_wait_must_end_before_rllib_drops_the_sample():
    with pytest.raises(ValueError, match=r"sample_wait_s.*must be below.*sample_timeout_s"):
        check_against(RunnerSettings(sample_wait_s=60.0), 60.0)
    check_against(RunnerSettings(sample_wait_s=10.0), 60.0)
    check_against(RunnerSettings(sample_wait_s=100.0), None)  # RLlib waits forever


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_idle_share_is_the_robots_waiting_time_over_their_connected_time():
    clock = Clock()
    figures = LinkFigures(clock)
    figures.opened(0)
    figures.infer_read(0, [0, 1], at=0.0)  # two robots wait from 0 ...
    clock.now = 1.0
    figures.answer_sent(0, [0, 1], read_at=0.0)  # ... for 1 s
    figures.inference(rows=2, seconds=0.004)
    clock.now = 4.0
    first = figures.take()
    # 2 robots x 1 s waiting over 2 robots x 4 s connected
    assert first.idle_share == pytest.approx(0.25)
    assert (first.bridges, first.robots, first.infers) == (1, 2, 1)
    assert first.round_trip_ms == pytest.approx(1000.0)
    assert first.inference_ms_per_row == pytest.approx(2.0)
    figures.infer_read(0, [0], at=4.0)
    clock.now = 6.0
    second = figures.take()  # robot 0 still waits: 2 s of 2 x 2 s
    assert second.idle_share == pytest.approx(0.5) and second.round_trip_ms is None
    clock.now = 7.0
    figures.answer_sent(0, [0], read_at=4.0)
    clock.now = 8.0
    third = figures.take()  # only the second after the window began counts: 1 s of 2 x 2 s
    assert third.idle_share == pytest.approx(0.25)
    figures.closed(0)
    assert figures.take().robots == 0 and figures.bridges == 0


def test_the_paused_share_is_the_waiting_while_the_runner_answered_nobody():
    clock = Clock()
    figures = LinkFigures(clock)
    figures.opened(0)
    figures.infer_read(0, [0], at=0.0)
    clock.now = 1.0
    figures.answer_sent(0, [0], read_at=0.0)  # 1 s of ordinary waiting
    figures.pause()  # sample() returned: the learner updates
    clock.now = 2.0
    figures.infer_read(0, [0], at=2.0)
    clock.now = 5.0
    figures.resume()  # 3 s waiting for the update
    clock.now = 6.0
    figures.answer_sent(0, [0], read_at=2.0)
    clock.now = 10.0
    taken = figures.take()
    assert taken.idle_share == pytest.approx(0.5)  # 1 + 4 s of 10
    assert taken.paused_share == pytest.approx(0.3)  # 3 s of 10


def test_the_demo_learner_refuses_to_start_ray_without_the_site_packages_instead_of_waiting_forever():
    """Ray passes -S on to its workers, which then cannot import Ray: ray.init would wait for them forever."""
    import subprocess
    import sys

    code = "import site; site.main(); from plugrl_ros.rllib.demo import start_ray; start_ray()"
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1 and "Ray cannot start here" in done.stderr and "(-S)" in done.stderr, done.stderr
