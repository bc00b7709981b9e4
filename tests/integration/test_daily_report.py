"""The daily report: built from one UTC day's ledger transitions, stored once per key, delivered once
through its outbox to the file notifier — however often `lapse report` runs for that date. The
report role's passes on a moved clock: a day still open is rebuilt as a partial report and never
sent; once it has closed (plus the grace period) its final report replaces the partial one and is
sent exactly once, whatever the number of passes, restarts or concurrent report roles."""

from __future__ import annotations

import json
import threading
from datetime import UTC, date, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import insert, select

from lapse.kernel.database import make_engine
from lapse.kernel.models import cleanup_ledger, daily_reports, ledger_transitions
from lapse.reports import PassResult, report_pass, run_daily_reports
from lapse.reports.daily_report import deliver_pending, enqueue_report
from lapse.reports.notifiers import FileNotifier
from lapse.shell.app import main

DAY = date(2026, 11, 28)
MIDNIGHT = datetime(2026, 11, 28, tzinfo=UTC)
GRACE = timedelta(minutes=5)


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
                                        "partial": False, "delivered": ["daily-report:2026-11-28"],
                                        "failed": {}, "notifier": "file"}
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
    stored = enqueue_report(engine, DAY, now)
    assert (stored.key, stored.action, stored.partial) == ("daily-report:2026-11-28", "stored", False)

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


class RecordingNotifier:
    """Keeps every report it is asked to send, in order (the file notifier would hide a repeat)."""

    name = "recording"

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []
        self.lock = threading.Lock()

    def send(self, key: str, report: dict) -> None:
        with self.lock:
            self.sent.append((key, report))


def _stored(engine, day: date) -> tuple[bool, int, bool]:
    """(partial, op_keys, delivered) of the stored report of `day`."""
    with engine.connect() as conn:
        payload, delivered = conn.execute(select(daily_reports.c.payload, daily_reports.c.delivered_at.is_not(None))
                                          .where(daily_reports.c.report_date == day)).one()
    return payload["partial"], payload["op_keys"], delivered


def test_open_day_is_rebuilt_partial_then_sent_once_final_after_it_closes(pg_url, tmp_path):
    engine = make_engine(pg_url)
    seed(engine)
    notifier = RecordingNotifier()
    stop = threading.Event()
    times = iter([MIDNIGHT + timedelta(hours=6), MIDNIGHT + timedelta(hours=23, minutes=59, seconds=30),
                  MIDNIGHT + timedelta(days=1, minutes=2), MIDNIGHT + timedelta(days=1, minutes=6),
                  MIDNIGHT + timedelta(days=1, minutes=11)])
    seen: list[tuple[bool, int, bool]] = []
    stored_actions: list[dict[str, str]] = []

    def after(result: PassResult) -> None:
        seen.append(_stored(engine, DAY))
        stored_actions.append({s.key: s.action for s in result.stored})
        if len(seen) == 3:  # a transaction begun before midnight commits inside the grace period
            with engine.begin() as conn:
                key = "release-reservation:7"
                conn.execute(insert(cleanup_ledger).values(
                    op_key=key, kind="release-reservation", tenant="t", subject_id="7", state="applied",
                    due_at=MIDNIGHT, correlation_id="c7", source="sweep", created_at=MIDNIGHT, updated_at=MIDNIGHT))
                conn.execute(insert(ledger_transitions), [
                    _transition(key, "pending", "applied", 1, "w1", MIDNIGHT + timedelta(hours=23, minutes=59,
                                                                                        seconds=59))])
        if len(seen) == 5:
            stop.set()

    run_daily_reports(engine, notifier, grace=GRACE, interval_s=0, stop=stop, clock=lambda: next(times),
                      on_pass=after)

    # (partial, op keys, delivered) of 2026-11-28 after each pass: rebuilt while open, final after
    # midnight + the grace period (with the late commit), then never changed.
    assert seen == [(True, 2, False), (True, 3, False), (True, 3, False), (False, 4, True), (False, 4, True)]
    assert stored_actions[1]["daily-report:2026-11-28"] == "rebuilt"
    assert stored_actions[3]["daily-report:2026-11-28"] == "finalised"
    assert stored_actions[4]["daily-report:2026-11-28"] == "unchanged"
    assert [(key, r["partial"], r["op_keys"]) for key, r in notifier.sent] == [
        ("daily-report:2026-11-27", False, 1), ("daily-report:2026-11-28", False, 4)]
    assert notifier.sent[1][1]["op_keys_by_kind_and_state"] == {
        "release-reservation": {"pending": 3, "applied": 3, "skipped": 1}}
    assert _stored(engine, DAY + timedelta(days=1)) == (True, 1, False)  # the new open day, not sent
    engine.dispose()


def test_two_report_roles_and_a_restart_send_a_closed_day_once(pg_url):
    engine = make_engine(pg_url)
    seed(engine)
    notifier = RecordingNotifier()
    report_pass(engine, notifier, MIDNIGHT + timedelta(hours=12), GRACE)  # a partial report stored
    assert [key for key, _ in notifier.sent] == ["daily-report:2026-11-27"]
    closed = MIDNIGHT + timedelta(days=1, minutes=10)
    engines = [make_engine(pg_url), make_engine(pg_url)]
    start = threading.Barrier(2)

    def role(role_engine) -> None:
        for _ in range(3):
            start.wait(10)
            report_pass(role_engine, notifier, closed, GRACE)

    roles = [threading.Thread(target=role, args=(e,)) for e in engines]
    for t in roles:
        t.start()
    for t in roles:
        t.join(60)
    report_pass(engine, notifier, closed + timedelta(minutes=5), GRACE)  # a restarted role

    assert [key for key, _ in notifier.sent] == ["daily-report:2026-11-27", "daily-report:2026-11-28"]
    assert _stored(engine, DAY) == (False, 3, True)
    for e in (*engines, engine):
        e.dispose()


def test_report_of_the_open_day_is_partial_and_not_sent(pg_url, tmp_path):
    folder = tmp_path / "reports"
    today = datetime.now(UTC).date().isoformat()
    first = run_report(pg_url, folder, "--date", today, "--json")
    again = run_report(pg_url, folder, "--date", today, "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout) == {"report_key": f"daily-report:{today}", "enqueued": True,
                                        "partial": True, "delivered": [], "failed": {}, "notifier": "file"}
    assert (json.loads(again.stdout)["enqueued"], json.loads(again.stdout)["partial"]) == (True, True)  # rebuilt
    assert list(folder.glob("*.json")) == []
