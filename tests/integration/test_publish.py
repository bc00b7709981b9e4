"""The application's publish path: the event exists iff the business change committed, and the
relay publishes it (due now → lapse.expiry; later → the delay tier with its lapse-due-at header)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from lapse.devtools.demo_tables import reservations
from lapse.kernel.delays import DUE_AT_HEADER, TARGET_HEADER
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.ledger import millis
from lapse.kernel.models import cleanup_ledger, outbox
from lapse.producers.publish import schedule_cleanup
from lapse.producers.relay import relay_until_empty
from tests.fixtures.kafka import read_topic
from tests.fixtures.topology import tier_covering

KIND = "release-reservation"


def hold(conn, expires_at) -> int:
    return conn.execute(insert(reservations).values(
        tenant="t1", status="held", expires_at=expires_at).returning(reservations.c.id)).scalar()


def counts(engine) -> tuple[int, int]:
    with engine.connect() as conn:
        return (conn.execute(select(func.count()).select_from(cleanup_ledger)).scalar(),
                conn.execute(select(func.count()).select_from(outbox)).scalar())


def test_event_exists_iff_the_business_change_commits(pipeline):
    p = pipeline
    now = datetime.now(UTC).replace(microsecond=0)
    due = now - timedelta(seconds=1)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), p.engine.begin() as conn:
        rid = hold(conn, due)
        schedule_cleanup(conn, KIND, rid, "t1", due, settings=p.settings)
        raise Boom  # the application's transaction rolls back
    assert counts(p.engine) == (0, 0)

    with Session(p.engine) as session, session.begin():
        rid = hold(session.connection(), due)
        assert schedule_cleanup(session, KIND, rid, "t1", due, correlation_id="corr-1",
                                settings=p.settings, now=now)
    with p.engine.begin() as conn:  # a second call for the same op key writes nothing
        assert not schedule_cleanup(conn, KIND, rid, "t1", due, settings=p.settings)
    assert counts(p.engine) == (1, 1)

    relay_until_empty(p.engine, make_producer(p.settings), p.codec, 10)
    (msg,) = read_topic(p.settings.kafka.bootstrap_servers, p.settings.topology.expiry)
    record = p.codec.decode_expected("expiry_event", msg.value())
    assert msg.key() == f"{KIND}:{rid}".encode()
    assert (record["op_key"], record["source"], record["correlation_id"], record["attributes"]) == (
        f"{KIND}:{rid}", "publish", "corr-1", {})
    assert (record["due_at"], record["produced_at"]) == (due, now)  # epoch millis round-trip
    with p.engine.connect() as conn:
        state, source = conn.execute(select(cleanup_ledger.c.state, cleanup_ledger.c.source)).one()
    assert (state, source) == ("pending", "publish")


def test_work_not_yet_due_waits_in_the_delay_tier(pipeline):
    p = pipeline
    now = datetime.now(UTC)
    due = now + timedelta(seconds=20)
    with p.engine.begin() as conn:
        rid = hold(conn, due)
        schedule_cleanup(conn, KIND, rid, "t1", due, settings=p.settings, now=now)
    relay_until_empty(p.engine, make_producer(p.settings), p.codec, 10)

    assert read_topic(p.settings.kafka.bootstrap_servers, p.settings.topology.expiry) == []
    (msg,) = read_topic(p.settings.kafka.bootstrap_servers, tier_covering(p.settings.topology, 20))
    headers = dict(msg.headers())
    assert headers[DUE_AT_HEADER] == str(millis(due)).encode()
    assert headers[TARGET_HEADER] == p.settings.topology.expiry.encode()
    assert p.codec.decode_expected("expiry_event", msg.value())["op_key"] == f"{KIND}:{rid}"


def test_unknown_kind_and_naive_time_are_refused(pipeline):
    p = pipeline
    with p.engine.begin() as conn:
        with pytest.raises(ValueError, match="unknown cleanup kind"):
            schedule_cleanup(conn, "no-such-kind", 1, "t1", datetime.now(UTC), settings=p.settings)
        with pytest.raises(ValueError, match="timezone-aware"):
            schedule_cleanup(conn, KIND, 1, "t1", datetime.now(), settings=p.settings)
