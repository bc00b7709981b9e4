"""Many readers of one history: three groups read the outcomes at once and each sees every
outcome; `lapse offsets reset` moves one group only, refuses while that group is active, refuses a
group topics.yaml does not declare unless --any-group, and records an executed reset."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from confluent_kafka import TopicPartition
from sqlalchemy import select, text

from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import make_consumer
from lapse.kernel.models import operator_actions
from lapse.readers.offsets import committed
from lapse.shell.app import main
from tests.fixtures.pipeline import connection_env, make_pipeline_settings
from tests.fixtures.polling import eventually
from tests.fixtures.readers import READER_TOPICS, outcome_record, produce_outcomes

OUTCOMES = 12


def _read_all(settings, group: str, seen: set, timeout_s: float = 60.0) -> None:
    """Consume the outcomes topic in `group` until every outcome is seen, committing as it goes."""
    codec = Codec.from_settings(settings)
    consumer = make_consumer(settings, group)
    consumer.subscribe([settings.topology.outcomes])

    def read_and_commit() -> bool:
        batch = [m for m in consumer.consume(100, 0.5) if m.error() is None]
        for msg in batch:
            seen.add(codec.decode_expected("cleanup_outcome", msg.value())["outcome_id"])
        if batch:
            nxt = {}
            for msg in batch:
                nxt[msg.partition()] = max(nxt.get(msg.partition(), 0), msg.offset() + 1)
            consumer.commit(offsets=[TopicPartition(settings.topology.outcomes, p, o)
                                     for p, o in nxt.items()], asynchronous=False)
        return len(seen) >= OUTCOMES

    try:
        eventually(read_and_commit, timeout_s=timeout_s, interval_s=0, what=f"every outcome read in {group}")
    finally:
        consumer.close()


def _positions(settings, group: str) -> dict[int, int | None]:
    found = committed(settings, group, settings.topology.outcomes, [0, 1, 2])
    return {p: o for (_, p), o in found.items()}


def _reset(settings, *args) -> tuple[int, str]:
    env = {**connection_env(settings), "LAPSE_RUNTIME__LOG_LEVEL": "WARNING"}
    result = CliRunner().invoke(main, ["offsets", "reset", "--topic", settings.topology.outcomes, *args],
                                env=env)
    return result.exit_code, (result.stdout if result.exit_code == 0 else result.output)


def _actions(url) -> tuple[list[dict], str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(select(operator_actions).order_by(operator_actions.c.id)).mappings()]
            return rows, conn.execute(text("SELECT current_user")).scalar_one()
    finally:
        engine.dispose()


def test_groups_read_independently_and_a_reset_moves_only_one(kafka_bootstrap, pg_url, unique):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS)
    before = datetime.now(UTC) - timedelta(seconds=1)
    produce_outcomes(settings, [outcome_record(i, str(i)) for i in range(1, OUTCOMES + 1)])
    # The first group is the one topics.yaml declares as reading the outcomes; the others are not declared.
    groups = [settings.topology.groups.analytics, unique("reports"), unique("audit")]
    seen = {g: set() for g in groups}
    threads = [threading.Thread(target=_read_all, args=(settings, g, seen[g])) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert all(s == set(range(1, OUTCOMES + 1)) for s in seen.values())
    ends = _positions(settings, groups[0])
    assert sum(ends.values()) == OUTCOMES
    assert all(_positions(settings, g) == ends for g in groups)

    code, out = _reset(settings, "--group", groups[0], "--to-earliest", "--json")
    plan = json.loads(out)
    assert (code, plan["executed"]) == (0, False)
    assert {r["partition"]: (r["old"], r["new"]) for r in plan["partitions"]} == {
        p: (o, 0) for p, o in ends.items()}
    assert _positions(settings, groups[0]) == ends  # a dry run changes nothing

    code, out = _reset(settings, "--group", groups[0], "--to-earliest", "--execute")
    assert code == 2 and "--reason" in out  # an executed reset says why
    assert _actions(pg_url)[0] == []
    code, out = _reset(settings, "--group", groups[0], "--to-earliest", "--execute", "--json",
                       "--reason", "re-read for the report fix", "--actor", "carol")
    assert code == 0, out
    assert _positions(settings, groups[0]) == {0: 0, 1: 0, 2: 0}
    assert _positions(settings, groups[1]) == ends and _positions(settings, groups[2]) == ends
    actions, user = _actions(pg_url)
    assert [(a["action"], a["actor"], a["reason"], a["db_user"], a["target"]) for a in actions] == [
        ("offsets_reset", "carol", "re-read for the report fix", user, f"group {groups[0]}")]
    assert actions[0]["details"]["how"] == "to-earliest"
    assert {r["partition"]: (r["old"], r["new"]) for r in actions[0]["details"]["partitions"]} == {
        p: (o, 0) for p, o in ends.items()}

    # A group topics.yaml does not declare: refused in one line unless --any-group; nothing moves.
    code, out = _reset(settings, "--group", groups[2], "--to-earliest", "--execute", "--reason", "x")
    assert code == 2 and "not declared" in out and "--any-group" in out and out.count("\n") == 1
    assert _positions(settings, groups[2]) == ends
    code, out = _reset(settings, "--group", groups[2], "--any-group", "--shift-by", "-1", "--execute",
                       "--reason", "skip back one", "--actor", "dave")
    assert code == 0, out
    assert _positions(settings, groups[2]) == {p: o - 1 if o else 0 for p, o in ends.items()}
    assert [(a["actor"], a["target"]) for a in _actions(pg_url)[0]] == [
        ("carol", f"group {groups[0]}"), ("dave", f"group {groups[2]}")]

    # Timestamp lookups (a dry run): before the first record → 0, after the last → the end.
    for when, expected in ((before, {0: 0, 1: 0, 2: 0}), (datetime.now(UTC) + timedelta(hours=1), ends)):
        code, out = _reset(settings, "--group", groups[1], "--any-group", "--to-datetime", when.isoformat(),
                           "--json")
        assert code == 0, out
        assert {r["partition"]: r["new"] for r in json.loads(out)["partitions"]} == expected

    # While a member of the second group is running, the reset refuses and moves nothing.
    member = make_consumer(settings, groups[1])
    member.subscribe([settings.topology.outcomes])

    def joined() -> bool:
        if member.assignment():
            return True
        member.consume(10, 0.2)
        return False

    try:
        eventually(joined, timeout_s=30, interval_s=0, what="a member of the second group assigned")
        code, out = _reset(settings, "--group", groups[1], "--any-group", "--shift-by", "-1", "--execute",
                           "--reason", "x", "--actor", "eve")
    finally:
        member.close()
    assert code == 1 and "is active" in out
    assert _positions(settings, groups[1]) == ends
    assert len(_actions(pg_url)[0]) == 2  # a refused reset leaves no record
