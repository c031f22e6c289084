"""The newest-message store: conversions done once, on a worker when prefetched, errors kept intact."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from plugrl_ros.robot.env_io import Latest
from plugrl_ros.ros.sources import ConversionError

pytestmark = [pytest.mark.ros]


class Counting:
    """A converter that records which thread converted which message."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, str]] = []

    def convert(self, msg: object) -> object:
        self.calls.append((msg, threading.current_thread().name))
        if msg == "corrupt":
            raise ConversionError("could not decode the CompressedImage")
        return f"converted {msg}"


def test_a_message_is_converted_once_however_often_it_is_captured():
    latest, converter = Latest(), Counting()
    latest.store("a", 1)
    assert latest.converted(converter) == latest.converted(converter) == "converted a"
    assert converter.calls == [("a", threading.current_thread().name)]


def test_a_prefetched_conversion_runs_on_the_worker_and_is_collected_at_capture():
    latest, converter = Latest(), Counting()
    with ThreadPoolExecutor(1, thread_name_prefix="worker") as pool:
        latest.store("a", 1)
        latest.prefetch(converter, pool)
        assert latest.converted(converter) == "converted a"
    assert len(converter.calls) == 1 and converter.calls[0][1].startswith("worker")


def test_a_conversion_error_on_the_worker_is_raised_at_capture_as_if_converted_there():
    latest, converter = Latest(), Counting()
    with ThreadPoolExecutor(1) as pool:
        latest.store("corrupt", 1)
        latest.prefetch(converter, pool)
        with pytest.raises(ConversionError, match="could not decode"):
            latest.converted(converter)


def test_a_newer_message_is_never_answered_with_an_older_prefetch():
    latest, converter = Latest(), Counting()
    with ThreadPoolExecutor(1) as pool:
        latest.store("old", 1)
        latest.prefetch(converter, pool)
        latest.store("new", 2)  # arrived, not prefetched
        assert latest.converted(converter) == "converted new"


def test_after_the_pool_shuts_down_conversion_falls_back_inline():
    latest, converter = Latest(), Counting()
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    latest.store("a", 1)
    latest.prefetch(converter, pool)
    assert latest.converted(converter) == "converted a"
