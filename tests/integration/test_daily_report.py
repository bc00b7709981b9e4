"""The daily report: built from one UTC day's ledger transitions, stored once per key, delivered once
through its outbox to the file notifier — however often `lapse report` runs for that date."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import insert, select

from lapse.kernel.database import make_engine
from lapse.kernel.models import cleanup_ledger, daily_reports, ledger_transitions
from lapse.reconciler.daily_report import deliver_pending, enqueue_report
from lapse.reconciler.notifiers import FileNotifier
from lapse.shell.app import main

DAY = date(2026, 11, 28)
MIDNIGHT = datetime(2026, 11, 28, tzinfo=UTC)


def seed(engine) -> None:
    """Op keys 1-3 finish on DAY (one at its first instant), 4 the day before, 5 at the next midnight."""
    finished = {1: ("applied", MIDNIGHT), 2: ("applied", MIDNIGHT + timedelta(hours=5)),
                3: ("skipped", MIDNIGHT + timedelta(hours=23, minutes=59)),
                4: ("applied", MIDNIGHT - timedelta(seconds=1)),
                5: ("applied", MIDNIGHT + timedelta(days=1))}
    with engine.begin() as conn:
        for i, (state, at) in finished.items():
            key = f"release-reservation:{i}"
            conn.execute(insert(cleanup_ledger).values(
                op_key=key, kind="release-reservation", tenant="t", subject_id=str(i), state=state,
                due_at=at, correlation_id=f"c{i}", source="sweep", created_at=at, updated_at=at))
            conn.execute(insert(ledger_transitions), [
                _transition(key, None, "pending", 0, "sweep", at),
                _transition(key, "pending", state, 1, "w1", at)])


def _transition(op_key: str, from_state: str | None, to_state: str, attempt: int, actor: str,
                at: datetime) -> dict:
    """A ledger_transitions row as the ledger writes it (this test seeds history by hand)."""
    return {"op_key": op_key, "from_state": from_state, "to_state": to_state, "attempt": attempt,
            "failure_class": None, "reason": None, "actor": actor, "replay_id": None,
            "correlation_id": None, "at": at}


def run_report(db_url: str, folder, *args: str):
    env = {"LAPSE_DATABASE__URL": db_url, "LAPSE_REPORT__DIR": str(folder), "LAPSE_RUNTIME__LOG_FORMAT": "text"}
    return CliRunner().invoke(main, ["report", *args], env=env)


def test_report_twice_for_a_date_sends_once(db_url, tmp_path):
    engine = make_engine(db_url)
    seed(engine)
    folder = tmp_path / "reports"

    first = run_report(db_url, folder, "--date", "2026-11-28", "--json")
    second = run_report(db_url, folder, "--date", "2026-11-28", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout) == {"report_key": "daily-report:2026-11-28", "enqueued": True,
                                        "delivered": ["daily-report:2026-11-28"], "failed": {},
                                        "notifier": "file"}
    assert json.loads(second.stdout)["enqueued"] is False
    assert json.loads(second.stdout)["delivered"] == []

    (sent,) = folder.glob("*.json")
    body = json.loads(sent.read_text())
    assert body["idempotency_key"] == "daily-report:2026-11-28"
    assert body["report"]["op_keys"] == 3
    assert body["report"]["op_keys_by_kind_and_state"] == {
        "release-reservation": {"pending": 3, "applied": 2, "skipped": 1}}
    with engine.connect() as conn:
        rows = conn.execute(select(daily_reports.c.report_key, daily_reports.c.attempts,
                                   daily_reports.c.delivered_at.is_not(None))).all()
    assert rows == [("daily-report:2026-11-28", 1, True)]
    engine.dispose()


def test_failed_delivery_is_kept_and_retried_without_rebuilding(db_url, tmp_path):
    engine = make_engine(db_url)
    seed(engine)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    now = datetime(2026, 11, 29, 1, tzinfo=UTC)
    assert enqueue_report(engine, DAY, now) == ("daily-report:2026-11-28", True)

    failed = deliver_pending(engine, FileNotifier(blocker / "reports"), now)
    assert list(failed.failed) == ["daily-report:2026-11-28"]
    retried = deliver_pending(engine, FileNotifier(tmp_path / "reports"), now)
    assert retried.delivered == ["daily-report:2026-11-28"]
    assert deliver_pending(engine, FileNotifier(tmp_path / "reports"), now).delivered == []
    assert len(list((tmp_path / "reports").glob("*.json"))) == 1
    with engine.connect() as conn:
        attempts, error = conn.execute(select(daily_reports.c.attempts, daily_reports.c.last_error)).one()
    assert (attempts, error) == (2, None)
    engine.dispose()
