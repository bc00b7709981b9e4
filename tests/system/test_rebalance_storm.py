"""A rebalance storm of SIGTERMs: cleanup workers (real `lapse process` processes) are stopped one
after another while new ones join and events keep arriving. Every worker that gets SIGTERM exits 0
within 30 s, having committed only for partitions it still owned, and every event is applied
exactly once with every offset committed at the end."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tests.fixtures.pipeline import (
    EXPIRY_PARTITIONS,
    all_committed,
    assert_each_applied_once,
    expiry_event,
    produce,
    seed,
)
from tests.fixtures.polling import eventually
from tests.fixtures.processes import ASSIGNED, RoleProcess, RoleProcesses
from tests.fixtures.workers import ledger_all_terminal

EVENTS = 3000
WORKERS = 3
ROUNDS = 6  # each: one worker SIGTERMed, one new worker started
EXIT_BOUND_S = 30.0  # the stated bound: a SIGTERMed worker is gone within this


def produce_over(pipeline, ids: list[int], chunks: int, pause_s: float) -> threading.Thread:
    """Produce the events of `ids` in `chunks` parts, `pause_s` apart, on a thread."""
    def run() -> None:
        size = -(-len(ids) // chunks)
        for start in range(0, len(ids), size):
            produce(pipeline, [expiry_event(i) for i in ids[start:start + size]])
            time.sleep(pause_s)
    thread = threading.Thread(target=run, name="storm-producer", daemon=True)
    thread.start()
    return thread


def assigned(workers: list[RoleProcess]) -> bool:
    return all(w.said(ASSIGNED) for w in workers)


def exits(stopped: list[RoleProcess]) -> list[tuple[int | None, str]]:
    """Each SIGTERMed worker's exit code, waiting at most EXIT_BOUND_S from its SIGTERM, with its
    last log lines for the failure message."""
    return [(w.wait_exit(EXIT_BOUND_S), w.tail()) for w in stopped]


@pytest.mark.slow
def test_every_worker_stopped_in_a_rebalance_storm_exits_cleanly_and_nothing_is_applied_twice(
        pipeline, tmp_path):
    ids = seed(pipeline, EVENTS, tenant="t1")  # the tenant of expiry_event
    procs = RoleProcesses(pipeline.settings, tmp_path, processor__batch_size=100)
    rng = random.Random(11)
    try:
        for _ in range(WORKERS):
            procs.start("process")
        eventually(lambda: assigned(procs.running()), timeout_s=60, what="the first workers in the group")
        producer = produce_over(pipeline, ids, chunks=ROUNDS * 2, pause_s=1.0)
        stopped: list[RoleProcess] = []
        for _ in range(ROUNDS):
            # the oldest worker that has its share leaves; a new one joins at once (another rebalance)
            leaving = next(w for w in procs.running() if w.said(ASSIGNED))
            leaving.terminate()
            stopped.append(leaving)
            procs.start("process")
            time.sleep(rng.uniform(1.0, 3.0))
            eventually(lambda: any(w.said(ASSIGNED) for w in procs.running()), timeout_s=60,
                       what="a worker with partitions")
        producer.join(120)

        eventually(lambda: ledger_all_terminal(pipeline.engine, terminal=EVENTS) and all_committed(pipeline),
                   timeout_s=180, interval_s=1.0,
                   what=f"{EVENTS} terminal ledger rows and every offset of {EXPIRY_PARTITIONS} partitions committed")
        last = procs.running()
        eventually(lambda: assigned(last), timeout_s=60, what="the last workers in the group")
        for worker in last:
            worker.terminate()
        stopped += last
        for code, tail in exits(stopped):
            assert code == 0, f"a worker did not exit 0 within {EXIT_BOUND_S:g} s of SIGTERM: {code}\n{tail}"
    finally:
        procs.close()
    assert_each_applied_once(pipeline, EVENTS)
    print(f"rebalance storm: {len(stopped)} workers SIGTERMed, exits after (s): "
          f"{[round(w.exit_s or 0, 1) for w in stopped]}")
