"""The brakes with every role running (`lapse run --workers 3`) on Apache Kafka and PostgreSQL, a
trigger on the business table recording each change with the database's `clock_timestamp()`:

- a kind paused mid-backlog changes no business row later than 5 s after `lapse pause` returns,
  while another kind keeps running; SIGKILLing every role process while paused changes nothing;
  after `lapse resume` every held row is changed exactly once, its attempt as if never paused;
  the same for one tenant of the kind;
- a budget of 1,000 per minute over a backlog of rows: no minute holds more than 1,000 changes,
  the kind pauses itself, `lapse status` shows the pause and the finding, and the alert's series
  is there;
- a shadow-mode kind changes nothing and publishes `shadow` outcomes; switched to live, each
  eligible row is changed exactly once.
The 50,000-row variants run in `make scale`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import func, select, text

from lapse.devtools.demo_data import add_artifacts
from lapse.devtools.demo_tables import artifacts
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from lapse.operator_actions import run_pause
from lapse.processors import FilesystemObjectStore
from lapse.shell.status_collector import status_families
from tests.fixtures.changes import changes, record_changes
from tests.fixtures.kafka import read_topic
from tests.fixtures.pipeline import Pipeline, connection_env, seed, with_demo_kinds
from tests.fixtures.polling import eventually
from tests.fixtures.running import RunningPipeline, lapse_run

WORKERS = 3
RELEASE, DELETE = "release-reservation", "artifact-delete"
PAUSE_BOUND = timedelta(seconds=5)
ROWS = [pytest.param(5_000, id="5k"), pytest.param(50_000, id="50k", marks=pytest.mark.scale)]

pytestmark = pytest.mark.slow


def lapse(p: Pipeline, *args: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LAPSE_")}, **connection_env(p.settings)}
    return subprocess.run([sys.executable, "-m", "lapse", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def db_now(p: Pipeline):
    with p.engine.connect() as conn:
        return conn.execute(text("SELECT clock_timestamp()")).scalar_one()


def changed_ids(p: Pipeline) -> Counter[int]:
    return Counter(rid for rid, _, _ in changes(p.engine))


def all_changed(p: Pipeline, ids: list[int]) -> bool:
    """Whether every one of `ids` changed (the changes read once, not once an id)."""
    seen = changed_ids(p)
    return all(seen[i] for i in ids)


def ledger_of(p: Pipeline, kind: str) -> Counter[tuple[str, int]]:
    with p.engine.connect() as conn:
        return Counter((state, attempt) for state, attempt in conn.execute(
            select(cleanup_ledger.c.state, cleanup_ledger.c.attempt).where(cleanup_ledger.c.kind == kind)))


def live_artifacts(p: Pipeline, ids: list[int]) -> int:
    with p.engine.connect() as conn:
        return conn.execute(select(func.count()).where(artifacts.c.id.in_(ids), artifacts.c.status == "live")).scalar()


def kill_every_role(running: RunningPipeline) -> int:
    """SIGKILL every role process of `lapse run` (the supervisor starts them again)."""
    pids = running.children()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return len(pids)


def pause_mid_backlog(p: Pipeline, ids: list[int], tenant: str | None = None) -> object:
    """Once a twentieth of `ids` changed, pause the kind (or one tenant of it) as `lapse pause`
    does (its operator action, in process: the command's start-up would let a backlog of this size
    finish first on a busy machine; tests/integration/test_pause_commands.py runs the command);
    the database's time the pause was made."""
    mine = set(ids)
    eventually(lambda: sum(1 for i in changed_ids(p) if i in mine) >= len(ids) // 20, timeout_s=120,
               interval_s=0.1, what="the backlog under way")
    assert run_pause(p.engine, RELEASE, tenant, reason="brakes test", actor="tester")["paused"]
    return db_now(p)


def late_changes(p: Pipeline, after, ids: set[int]) -> list[tuple[int, str, object]]:
    return [c for c in changes(p.engine) if c[0] in ids and c[2] > after + PAUSE_BOUND]


@pytest.mark.parametrize("rows", ROWS)
def test_a_pause_stops_every_effect_within_5s_and_a_resume_applies_each_held_row_once(pipeline, tmp_path, rows):
    p = with_demo_kinds(pipeline, tmp_path)
    record_changes(p.engine)
    ids = seed(p, rows, tenant="t1")
    store = FilesystemObjectStore(tmp_path / "kinds" / "objects")
    with lapse_run(p.settings, tmp_path, workers=WORKERS) as running:
        paused_at = pause_mid_backlog(p, ids)
        # Another kind keeps running: artifacts due after the pause are deleted.
        with p.engine.begin() as conn:
            others = add_artifacts(conn, 20, retain_until=db_now(p) - timedelta(seconds=1), store=store, tenant="t1")
        eventually(lambda: live_artifacts(p, others) == 0, timeout_s=120, what="the other kind's work done")
        time.sleep(max(0.0, (paused_at + timedelta(seconds=8) - db_now(p)).total_seconds()))
        assert late_changes(p, paused_at, set(ids)) == []
        held = ledger_of(p, RELEASE)[("held", 0)]
        assert held > 0, ledger_of(p, RELEASE)

        # SIGKILL every role process while paused: restarted, they change nothing either.
        assigned = running.logged("partitions assigned")
        assert kill_every_role(running) >= WORKERS + 4
        eventually(lambda: running.logged("partitions assigned") >= assigned + WORKERS, timeout_s=120,
                   what="the restarted workers back in the group")
        time.sleep(5)
        assert late_changes(p, paused_at, set(ids)) == []

        resumed = lapse(p, "resume", RELEASE, "--reason", "brakes test over", "--actor", "tester", "--json")
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout)["released"] > 0  # the reconciler's pass may release some too
        eventually(lambda: len(changed_ids(p)) == rows, timeout_s=300, interval_s=1.0,
                   what=f"all {rows} rows released after the resume")

        # One tenant of the kind: t2 paused mid-backlog, t1 goes on.
        t1, t2 = seed(p, rows // 5, tenant="t1"), seed(p, rows // 5, tenant="t2")
        tenant_paused_at = pause_mid_backlog(p, t1 + t2, "t2")
        eventually(lambda: all_changed(p, t1), timeout_s=300, interval_s=1.0,
                   what="tenant t1's rows released while t2 is paused")
        time.sleep(max(0.0, (tenant_paused_at + timedelta(seconds=8) - db_now(p)).total_seconds()))
        assert late_changes(p, tenant_paused_at, set(t2)) == []
        assert lapse(p, "resume", RELEASE, "--tenant", "t2", "--reason", "over", "--actor", "tester").returncode == 0
        eventually(lambda: len(changed_ids(p)) == rows + len(t1) + len(t2), timeout_s=300, interval_s=1.0,
                   what="tenant t2's rows released after its resume")

    every = changed_ids(p)
    assert set(every.values()) == {1}, "each business row changed exactly once"
    assert ledger_of(p, RELEASE) == {("applied", 1): rows + len(t1) + len(t2)}, "attempts as if never paused"
    with p.engine.connect() as conn:
        failures = conn.execute(select(func.count()).where(ledger_transitions.c.failure_class.is_not(None))).scalar()
    assert failures == 0


@pytest.mark.parametrize("rows", [pytest.param(2_000, id="2k"),
                                  pytest.param(50_000, id="50k", marks=pytest.mark.scale)])
def test_a_budget_holds_every_minute_for_three_workers_and_pauses_its_kind(pipeline, tmp_path, rows):
    p = with_demo_kinds(pipeline, tmp_path, **{RELEASE: "budget: {max_effects: 1000, per: 1m}"})
    record_changes(p.engine)
    seed(p, rows, tenant="t1")
    with lapse_run(p.settings, tmp_path, workers=WORKERS) as running:
        def budget_pause() -> dict | None:
            report = json.loads(lapse(p, "status", "--json", "--no-lag").stdout)
            return next((x for x in report["brakes"]["pauses"] if x["cause"] == "budget"), None) and report

        report = eventually(budget_pause, timeout_s=180, interval_s=1.0, what="the kind paused by its budget")
        time.sleep(3)
        running.assert_alive()
    at = sorted(at for _, _, at in changes(p.engine))
    busiest = max(sum(1 for t in at[i:] if t < start + timedelta(minutes=1)) for i, start in enumerate(at))
    assert busiest <= 1000 and len(at) <= 1000 * (1 + (at[-1] - at[0]) / timedelta(minutes=1))
    assert len(at) == 1000, "the budget was used whole, then the kind paused"
    (pause,) = report["brakes"]["pauses"]
    assert (pause["kind"], pause["cause"], pause["actor"]) == (RELEASE, "budget", "budget")
    assert pause["waiting"] > 0
    families = {f.name: f for f in status_families(report)}
    assert [s.labels for s in families["lapse_pause_age_seconds"].samples] == [
        {"kind": RELEASE, "tenant": "", "cause": "budget"}]  # the LapseBudgetSpent alert's series
    with p.engine.connect() as conn:
        finding = conn.execute(text("SELECT summary FROM lapse.lapse_findings WHERE role = 'budget'")).scalar_one()
    assert finding.startswith("budget of 1000 per 1m spent")


def test_a_shadow_kind_changes_nothing_and_live_then_changes_each_row_once(pipeline, tmp_path):
    rows = 500
    shadow = with_demo_kinds(pipeline, tmp_path, **{RELEASE: "mode: shadow"})
    record_changes(shadow.engine)
    seed(shadow, rows, tenant="t1")
    with lapse_run(shadow.settings, tmp_path, workers=WORKERS):
        eventually(lambda: ledger_of(shadow, RELEASE)[("shadowed", 0)] == rows, timeout_s=180, interval_s=1.0,
                   what="every row shadowed")
    assert changes(shadow.engine) == []
    plan = json.loads(lapse(shadow, "kinds", "plan", RELEASE, "--compare", "--json").stdout)
    assert plan["kinds"][0]["shadow"]["by_outcome"] == {"apply": rows}

    live = with_demo_kinds(pipeline, tmp_path)  # the same file, mode: live again
    with lapse_run(live.settings, tmp_path, workers=WORKERS):
        eventually(lambda: len(changed_ids(live)) == rows, timeout_s=180, interval_s=1.0,
                   what="every shadowed row changed once the kind is live")
        eventually(lambda: len(outcomes(live)) >= 2 * rows, timeout_s=60, what="the outcomes relayed")
    assert set(changed_ids(live).values()) == {1}
    assert ledger_of(live, RELEASE) == {("applied", 1): rows}
    by_status = Counter(status for _, status in outcomes(live))
    assert (by_status["shadow"], by_status["applied"]) == (rows, rows)


def outcomes(p: Pipeline) -> set[tuple[str, str]]:
    """(op key, status) of every outcome on the outcomes topic (the relay publishes at least once)."""
    s = p.settings
    return {(r["op_key"], r["status"]) for r in (p.codec.decode_expected("cleanup_outcome", m.value())
                                                 for m in read_topic(s.kafka.bootstrap_servers, s.topology.outcomes))}
