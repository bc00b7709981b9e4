"""A stop request ends the sweep and the reconciler between pages: the page in hand is finished
(ledger rows written, events flushed), the next one is not started, and the next pass picks up
where this one stopped."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import load_kinds
from lapse.producers.sweep import sweep_once
from lapse.reconciler import Reconciler
from tests.fixtures.kafka import read_topic
from tests.fixtures.pipeline import seed

ROWS, PAGE = 500, 100


class StopAfterChecks(threading.Event):
    """A stop that is set once it has been looked at `n` times: a SIGTERM arriving mid-pass."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    def is_set(self) -> bool:
        self.left -= 1
        if self.left < 0:
            self.set()
        return super().is_set()


def test_a_stopped_sweep_finishes_its_page_and_the_next_pass_goes_on(pipeline):
    seed(pipeline, ROWS)
    settings = pipeline.settings.with_(producer={"sweep_page_size": PAGE})
    producer = make_producer(settings)
    kinds = load_kinds(settings, pipeline.engine)
    # The sweep asks before each page of each kind: a reservation page, the (empty) artifact kind's,
    # another reservation page, then the stop.
    stopped = sweep_once(pipeline.engine, producer, pipeline.codec, settings, kinds, stop=StopAfterChecks(3))
    rest = sweep_once(pipeline.engine, producer, pipeline.codec, settings, kinds)
    assert (stopped.pages, stopped.emitted) == (2, 2 * PAGE)
    assert rest.emitted == ROWS - 2 * PAGE
    keys = [m.key() for m in read_topic(settings.kafka.bootstrap_servers, settings.topology.expiry)]
    assert len(keys) == len(set(keys)) == ROWS


def test_a_stopped_reconciler_ends_its_pass_between_pages(pipeline):
    seed(pipeline, ROWS, expires_at=datetime.now(UTC) - timedelta(hours=1))  # no ledger rows: gaps
    settings = pipeline.settings.with_(reconciler={"page_size": PAGE})
    kinds = load_kinds(settings, pipeline.engine)
    stop = StopAfterChecks(3)  # the pass's release of parked work looks once, before the kinds' pages
    report = Reconciler(pipeline.engine, make_producer(settings), pipeline.codec, settings, kinds,
                        stop=stop).run_once()
    assert report.pages == 2 and sum(report.gaps.values()) == 2 * PAGE
    again = Reconciler(pipeline.engine, make_producer(settings), pipeline.codec, settings, kinds).run_once()
    assert sum(again.gaps.values()) == ROWS - 2 * PAGE
