"""While offset commits stall, the worker holds its next batch with its partitions paused
(`CleanupWorker._hold_while_commits_stall`); librdkafka keeps a partition's pause across a rebalance,
so no partition paused for a stall may leave with one, or, given back later, it is never read again."""

from __future__ import annotations

import threading

from confluent_kafka import Consumer

from tests.fixtures.pipeline import all_committed, applied, expiry_event, produce, seed
from tests.fixtures.polling import eventually
from tests.fixtures.workers import running_workers


def test_partitions_taken_during_a_stall_are_read_when_given_back_after_another(pipeline):
    """Two stalls: during the first a member joins and takes some partitions; the second holds the
    rest; the member leaves and gives its partitions back. Every partition is read again: the
    events produced after all that are applied and every offset is committed."""
    settings = pipeline.settings
    ids = iter(seed(pipeline, 48))
    stalling, in_stall, out_of_stall = threading.Event(), threading.Event(), threading.Event()
    other = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers, "enable.auto.commit": False,
                      "group.id": settings.topology.groups.cleanup, "auto.offset.reset": "earliest"})

    def stall_by_turns(worker):
        real = worker.pending.stalled

        def stalled(*args, **kwargs) -> bool:  # the broker's refusals, on the test's word
            if stalling.is_set():
                in_stall.set()
                return True
            out_of_stall.set()
            return real(*args, **kwargs)
        worker.pending.stalled = stalled

    def stall(running, worker, *, members: int) -> None:
        """A stall begun by a batch consumed while `stalling` is set."""
        in_stall.clear()
        stalling.set()
        produce(pipeline, [expiry_event(next(ids)) for _ in range(12)])  # some land on the worker's
        eventually(lambda: (running.check(), members > 1 and other.poll(0.1), in_stall.is_set())[2],
                   timeout_s=60, what="the worker holding a batch back")

    def unstall(running, *, members: int) -> None:
        out_of_stall.clear()
        stalling.clear()
        eventually(lambda: (running.check(), members > 1 and other.poll(0.1), out_of_stall.is_set())[2],
                   timeout_s=60, what="the stall over")

    with running_workers(settings) as running:
        (worker,) = running.workers
        eventually(lambda: (running.check(), len(worker.owned) == 6)[1], timeout_s=60, what="all six assigned")
        stall_by_turns(worker)
        stall(running, worker, members=1)
        other.subscribe([settings.topology.expiry])
        eventually(lambda: (running.check(), other.poll(0.1), other.assignment() and len(worker.owned) < 6)[2],
                   timeout_s=60, what="a second member taking partitions during the stall")
        unstall(running, members=2)
        stall(running, worker, members=2)
        unstall(running, members=2)
        other.close()  # gives its partitions back to the worker
        eventually(lambda: (running.check(), len(worker.owned) == 6)[1], timeout_s=60, what="all six back")
        produce(pipeline, [expiry_event(next(ids)) for _ in range(24)])  # on every partition, in all likelihood
        eventually(lambda: (running.check(), applied(pipeline) == 48 and all_committed(pipeline))[1],
                   timeout_s=60, what="every partition read again and committed")
