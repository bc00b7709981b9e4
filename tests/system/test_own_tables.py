"""The README's "Clean up your own table", run as written against the wheel built from this
checkout, Apache Kafka and PostgreSQL: from an empty folder outside the repository, `lapse init`,
the config and kinds files the README shows, the user's own `shop` tables, `lapse db upgrade`,
`lapse topics apply`, `lapse kinds check`, `lapse run` until `lapse status --json` shows no eligible
work left. Then every eligible row changed exactly once and every other row is untouched.

The README's blocks carry `<!-- test: … -->` comments saying what each is (a file to write, SQL to
run, a command to leave running, a step the test does its own way); `sh` blocks without one are
commands, run line by line. Only the README's loopback addresses are swapped for the test's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from lapse.kernel.database import make_engine
from lapse.kernel.ledger import APPLIED
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from tests.fixtures.polling import eventually
from tests.fixtures.readme import commands, readme_blocks
from tests.fixtures.wheel import REPO, check_ok, run_clean

pytestmark = pytest.mark.slow

SECTION = "## Clean up your own table"
README_BOOTSTRAP = "127.0.0.1:9092"
README_DATABASE = "postgresql+psycopg://lapse@127.0.0.1:5432/shop"


# The test's own rows on top of the README's: ids 100 to 399, a third each due and pending (eligible),
# due and paid, pending and not due; sessions 100 to 299, every other one due.
def add_rows(engine, now: datetime) -> None:
    hour = timedelta(hours=1)
    orders = [{"id": i, "tenant": f"t{i % 7}",
               "status": "paid" if i % 3 == 1 else "pending",
               "expires_at": now + hour if i % 3 == 2 else now - hour} for i in range(100, 400)]
    sessions = [{"id": f"x-{i}", "expires_at": now - hour if i % 2 else now + hour} for i in range(100, 300)]
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO shop.orders (id, tenant_id, status, expires_at) "
                          "VALUES (:id, :tenant, :status, :expires_at)"), orders)
        conn.execute(text("INSERT INTO shop.sessions (id, expires_at) VALUES (:id, :expires_at)"), sessions)


def test_the_readme_section_cleans_up_a_users_own_tables(
        lapse_cli: Path, kafka_bootstrap: str, pg_empty_url: str, unique, tmp_path_factory) -> None:
    work = tmp_path_factory.mktemp("shop-cleanup")
    assert REPO not in work.parents and list(work.iterdir()) == []
    env = {"PATH": f"{lapse_cli.parent}:{os.environ['PATH']}",
           # Isolation from the other tests on the session broker only: its own topic names.
           "LAPSE_TOPICS__PREFIX": unique("own") + "."}
    swap = {README_BOOTSTRAP: kafka_bootstrap, README_DATABASE: pg_empty_url}
    engine = make_engine(pg_empty_url)
    start = datetime.now(UTC)
    blocks = readme_blocks(SECTION)
    assert {b.action for b in blocks} >= {"run", "file", "sql", "background"}, blocks

    def substituted(body: str) -> str:
        for old, new in swap.items():
            body = body.replace(old, new)
        return body

    def lapse_status() -> dict:
        return json.loads(check_ok(run_clean("bash", "-c", "lapse status --json --no-lag", cwd=work, **env)))

    def no_eligible_work_left() -> dict | None:
        shown = lapse_status()
        done = all(k["rows"] == 0 for k in shown["eligible"].values()) and shown["oldest_eligible_age_s"] is None
        return shown if done else None

    runner: subprocess.Popen[str] | None = None
    try:
        for block in blocks:
            if block.action == "run":
                for line in commands(block.body):
                    check_ok(run_clean("bash", "-c", substituted(line), cwd=work, **env))
            elif block.action == "file":
                assert block.arg, block
                (work / block.arg).write_text(substituted(block.body))
            elif block.action == "sql":
                with engine.begin() as conn:
                    conn.exec_driver_sql(block.body)
                add_rows(engine, start)
            elif block.action == "python":
                check_ok(run_clean(lapse_cli.parent / "python", "-c", substituted(block.body), cwd=work, **env))
            elif block.action == "background":
                (line,) = commands(block.body)
                runner = subprocess.Popen(
                    ["bash", "-c", f"exec {line}"], cwd=work, text=True, stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE, env={**{k: v for k, v in os.environ.items()
                                                    if not k.startswith(("LAPSE_", "PYTHON"))}, **env})
                shown = eventually(no_eligible_work_left, timeout_s=180, interval_s=1.0,
                                   what="no eligible work left in `lapse status --json`")
                assert runner.poll() is None, runner.stderr.read() if runner.stderr else ""
                assert set(shown["eligible"]) == {"expire-order", "purge-session"}
        assert runner is not None, "the section never runs the pipeline"
    finally:
        if runner is not None and runner.poll() is None:
            runner.send_signal(signal.SIGTERM)
            try:
                runner.wait(timeout=60)
            except subprocess.TimeoutExpired:
                runner.kill()
                pytest.fail("lapse run did not stop within 60 s of SIGTERM")

    with engine.connect() as conn:
        orders = {i: (s, e) for i, s, e in conn.execute(text("SELECT id, status, expired_at FROM shop.orders"))}
        sessions = set(conn.execute(text("SELECT id FROM shop.sessions")).scalars())
        applied = dict(conn.execute(select(cleanup_ledger.c.op_key, cleanup_ledger.c.state)).all())
        applied_twice = conn.execute(
            select(ledger_transitions.c.op_key).where(ledger_transitions.c.to_state == APPLIED)
            .group_by(ledger_transitions.c.op_key).having(func.count() > 1)).scalars().all()
    engine.dispose()

    eligible = {1, 4} | {i for i in range(100, 400) if i % 3 == 0}  # 4: the schedule_cleanup example
    untouched = {2: "paid", 3: "pending"} | {i: "paid" if i % 3 == 1 else "pending"
                                            for i in range(100, 400) if i % 3}
    assert {i for i, (s, e) in orders.items() if s == "expired" and e is not None} == eligible
    assert {i: s for i, (s, e) in orders.items() if i not in eligible} == untouched
    assert all(e is None for i, (s, e) in orders.items() if i not in eligible)
    assert sessions == {"s-2"} | {f"x-{i}" for i in range(100, 300) if i % 2 == 0}
    purged = {"s-1"} | {f"x-{i}" for i in range(100, 300) if i % 2}
    expected = {f"expire-order:{i}" for i in eligible} | {f"purge-session:{s}" for s in purged}
    assert applied == dict.fromkeys(expected, APPLIED)  # one ledger row each, nothing else
    assert applied_twice == []
