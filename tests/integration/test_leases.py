"""Lease renewal for effects outside the database: renewed while slow work runs, never forever."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, select

from lapse.kernel.kinds.effects import EffectCall
from lapse.kernel.ledger import expiry_event, pending_row, renew_leases
from lapse.kernel.models import cleanup_ledger
from lapse.processors.failures import AMBIGUOUS, TEMPORARY
from lapse.processors.leased import EffectRunner
from tests.fixtures.kinds import demo_kinds

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
KEY = "artifact-delete:1"
CALL = EffectCall("artifact-delete", KEY, 1, "1", "t", {"object_key": "exports/1.csv"})


def claimed_row(engine, owner: str, until: datetime) -> None:
    event = expiry_event("artifact-delete", 1, "t", T0, source="sweep", correlation_id="c")
    with engine.begin() as conn:
        conn.execute(insert(cleanup_ledger), [{**pending_row(event, T0), "state": "claimed",
                                               "claim_owner": owner, "claim_until": until}])


def renew_in_transaction(engine, keys, owner: str, until: datetime) -> None:
    with engine.begin() as conn:
        renew_leases(conn, keys, owner, until)


def claim_until(engine) -> datetime:
    with engine.connect() as conn:
        return conn.execute(select(cleanup_ledger.c.claim_until)).scalar()


class SteppingClock:
    """A fake clock that moves one minute each time it is read."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(minutes=1)
        return self.now


def test_a_slow_effect_keeps_its_lease_renewed_until_it_finishes(engine):
    claimed_row(engine, "w1", T0 + timedelta(seconds=30))
    release = threading.Event()
    calls = []

    def slow_delete(call: EffectCall) -> None:
        release.wait(5)

    clock = SteppingClock()

    def renew(keys):
        calls.append(list(keys))
        renew_in_transaction(engine, keys, "w1", clock() + timedelta(seconds=30))
        if len(calls) == 2:
            release.set()  # the effect finishes after two renewals

    runner = EffectRunner(lambda kind: slow_delete, concurrency=2, max_renewals=3)
    try:
        outcomes = runner.run([(demo_kinds(engine)["artifact-delete"], CALL)], lease_s=0.3, renew=renew)
    finally:
        runner.close()
    assert outcomes == {KEY: None}
    assert calls == [[KEY], [KEY]]
    assert claim_until(engine) == clock.now + timedelta(seconds=30)  # the last renewal's lease


def test_renewal_is_bounded_and_a_stuck_effect_is_reported_ambiguous(engine):
    claimed_row(engine, "w1", T0 + timedelta(seconds=30))
    stuck = threading.Event()
    calls = []

    def never_returns(call: EffectCall) -> None:
        stuck.wait(10)

    runner = EffectRunner(lambda kind: never_returns, concurrency=1, max_renewals=3)
    try:
        outcomes = runner.run([(demo_kinds(engine)["artifact-delete"], CALL)], lease_s=0.3,
                              renew=lambda keys: calls.append(list(keys)))
    finally:
        stuck.set()
        runner.close()
    assert len(calls) == 3  # max_renewals, then it stops renewing
    assert outcomes[KEY].failure_class == AMBIGUOUS


def test_renewal_never_extends_a_lease_another_worker_took_over(engine):
    claimed_row(engine, "w2", T0 + timedelta(seconds=30))
    renew_in_transaction(engine, [KEY], "w1", T0 + timedelta(hours=1))
    assert claim_until(engine) == T0 + timedelta(seconds=30)


def test_a_kind_whose_caller_cannot_be_built_fails_its_calls_as_temporary(engine):
    def unusable(kind):
        raise ValueError("an s3:// object store needs boto3: install lapse[s3]")

    runner = EffectRunner(unusable, concurrency=1)
    try:
        outcomes = runner.run([(demo_kinds(engine)["artifact-delete"], CALL)], lease_s=0.3, renew=lambda keys: None)
    finally:
        runner.close()
    assert outcomes[KEY].failure_class == TEMPORARY
    assert "install lapse[s3]" in outcomes[KEY].reason
