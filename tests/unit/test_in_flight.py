"""The one-slot batch thread: collecting returns the batch's result or error, calls the batch hands
over run on the collecting thread, and a slot collected from anywhere (a rebalance callback, while the
worker waits for more records) reads as ready, so the worker's wait for more records ends."""

from __future__ import annotations

import threading

import pytest

from lapse.processors.in_flight import InFlight
from tests.fixtures.polling import eventually


@pytest.fixture
def in_flight():
    slot: InFlight[str] = InFlight("test-batch")
    yield slot
    slot.collect()
    slot.close()


def test_collect_returns_the_result_and_frees_the_slot(in_flight):
    in_flight.submit(["m"], "decoded", lambda: "done")
    collected = in_flight.collect()
    assert collected is not None
    got = collected.messages, collected.decoded, collected.result, collected.error
    assert got == (["m"], "decoded", "done", None)
    assert not in_flight.busy
    assert in_flight.collect() is None


def test_a_failed_batch_is_returned_with_its_error_never_raised(in_flight):
    def fail() -> str:
        raise ValueError("database away")

    in_flight.submit([], None, fail)
    collected = in_flight.collect()
    assert collected is not None and collected.result is None
    assert isinstance(collected.error, ValueError)


def test_a_second_batch_is_refused_while_one_is_in_flight(in_flight):
    release = threading.Event()
    in_flight.submit([], None, lambda: str(release.wait(10)))
    with pytest.raises(RuntimeError, match="already in flight"):
        in_flight.submit([], None, lambda: "second")
    release.set()


def test_a_handed_over_call_runs_on_the_settling_thread(in_flight):
    in_flight.submit([], None, lambda: in_flight.on_consumer_thread(lambda: threading.current_thread().name))
    collected = in_flight.collect()
    assert collected is not None and collected.result == threading.current_thread().name


def test_ready_only_once_the_work_has_ended_or_waits_for_a_call(in_flight):
    release, called = threading.Event(), threading.Event()
    in_flight.submit([], None, lambda: str(release.wait(10)))
    assert in_flight.busy and not in_flight.ready()
    release.set()
    eventually(in_flight.ready, timeout_s=10, interval_s=0.01, what="ready")

    in_flight.collect()
    in_flight.submit([], None, lambda: in_flight.on_consumer_thread(called.set) or "after the call")
    # The batch waits for its call: collecting now would not block.
    eventually(in_flight.ready, timeout_s=10, interval_s=0.01, what="ready")
    collected = in_flight.collect()
    assert called.is_set() and collected is not None and collected.result == "after the call"


def test_a_slot_settled_elsewhere_reads_as_ready(in_flight):
    """The worker checks `busy`, then waits for more records until `ready()`; a rebalance callback
    inside that wait collects the batch. With nothing in flight any more, the wait must end: before
    this was so, the worker waited for a full batch of records that never came."""
    release = threading.Event()
    in_flight.submit([], None, lambda: str(release.wait(10)))
    assert not in_flight.ready()
    threading.Timer(0.05, release.set).start()
    assert in_flight.collect() is not None  # what the rebalance callback does
    assert not in_flight.busy
    assert in_flight.ready()

