"""The operator console in a real headless Chromium, over a running pipeline on Apache Kafka and
PostgreSQL: after a run with a retry and a dead letter, the overview shows what `lapse status
--json` shows, with its charts, and updates in place (no reload) when another dead letter comes;
the dead letter is found by its op key, replayed through the page after its dry run and
confirmation, and then applied; a viewer token cannot replay; a form without its CSRF token is
refused; and with no tokens the console serves loopback only. Over 135 dead letters: their groups
and total, two pages, "every one matching" replayed at once, search by business id and tenant.
Each page is saved to build/console-screenshots/*.png (docs/operations.md shows copies in
docs/console/, and copies of the charts in docs/images/)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from click.testing import CliRunner
from selenium.webdriver.common.by import By
from sqlalchemy import event, func, select

from lapse.kernel.database import make_engine
from lapse.kernel.models import cleanup_ledger, operator_actions, outbox
from lapse.kernel.settings import Settings
from lapse.readers import (
    daily_reports,
    dead_letter_groups,
    filtered_dead_letters,
    ledger_states,
    operation_of_subject,
    operator_action,
    tenant_operations,
    throughput,
    transition_buckets,
)
from lapse.reports import enqueue_report
from lapse.shell.app import main
from lapse.shell.console import create_app
from tests.fixtures.console import (
    add_hooks,
    chart_screenshot,
    chromium,
    make_dead_letters,
    running_console,
    running_pipeline,
    screenshot,
    write_hook_kind,
)
from tests.fixtures.effects import Answer
from tests.fixtures.pipeline import connection_env, make_pipeline_settings
from tests.fixtures.polling import eventually
from tests.fixtures.readers import sweep

OPERATOR, VIEWER = ("alice", "op-token-4f1c9a7e2b3d5f60"), ("victor", "view-token-9b2e61d04c7a")
CONSOLE = {"operator_tokens": {OPERATOR[0]: OPERATOR[1]}, "viewer_tokens": {VIEWER[0]: VIEWER[1]}}


def ledger(engine) -> dict[str, tuple]:
    with engine.connect() as conn:
        return {r.op_key: (r.state, r.attempt, r.last_failure_class, r.replay_id) for r in conn.execute(
            select(cleanup_ledger.c.op_key, cleanup_ledger.c.state, cleanup_ledger.c.attempt,
                   cleanup_ledger.c.last_failure_class, cleanup_ledger.c.replay_id))}


def actions(engine) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(operator_actions.c.action, operator_actions.c.actor,
                                                      operator_actions.c.reason, operator_actions.c.details))]


def unsent(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).where(outbox.c.sent_at.is_(None))).scalar_one()


def lapse_json(settings: Settings, *args: str) -> dict:
    """`lapse ARGS --json` on these settings; it must succeed."""
    env = {**connection_env(settings), "LAPSE_RUNTIME__LOG_LEVEL": "WARNING"}
    result = CliRunner().invoke(main, [*args, "--json"], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def status_json(settings: Settings) -> dict:
    return lapse_json(settings, "status")


def sign_in(driver, url: str, token: str) -> None:
    driver.get(url + "/")
    assert "/login" in driver.current_url  # nothing shown before signing in
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "sign-in").click()
    eventually(lambda: driver.find_elements(By.ID, "verdict"), timeout_s=30, what="the overview after signing in")


def shown_figures(driver) -> dict:
    """The overview's figures as its elements carry them."""
    def value(css: str) -> int:
        return int(driver.find_element(By.CSS_SELECTOR, css).get_attribute("data-value"))

    cells = driver.find_elements(By.CSS_SELECTOR, "#ledger td[data-state]")
    by_state: dict[str, dict[str, int]] = {}
    for cell in cells:
        by_state.setdefault(cell.get_attribute("data-state"), {})[cell.get_attribute("data-kind")] = int(
            cell.get_attribute("data-value"))
    lag_rows = driver.find_elements(By.CSS_SELECTOR, "#lag tr[data-group]")
    lag = {(row.get_attribute("data-group"), row.get_attribute("data-topic")):
           int(row.find_element(By.CSS_SELECTOR, ".records").get_attribute("data-value")) for row in lag_rows}
    members = {row.get_attribute("data-group"): int(row.find_element(By.CSS_SELECTOR, "[data-members]")
                                                    .get_attribute("data-members")) for row in lag_rows}
    return {"ledger": by_state, "dead_letters": value("#dead-letters"), "expired_claims": value("#expired-claims"),
            "outbox_unsent": value("#outbox-unsent"), "lag": lag, "members": members,
            "reconciler": driver.find_element(By.ID, "reconciler-finding").text,
            "audit": driver.find_element(By.ID, "audit-finding").get_attribute("data-verdict"),
            "verdict": driver.find_element(By.ID, "verdict").get_attribute("data-state")}


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match, "no CSRF token on the page"
    return match.group(1)


@pytest.mark.slow
def test_the_console_shows_status_and_replays_a_dead_letter_in_a_browser(kafka_bootstrap, pg_url, unique,
                                                                           http_server, tmp_path):
    http_server.script("ok", Answer(200))
    http_server.script("flaky", Answer(503, body=b"upstream down"), Answer(200))  # a retry, then applied
    http_server.script("bad", Answer(400, body=b'{"error": "unknown hook"}'), Answer(200))  # dead, then fixed
    http_server.script("late", Answer(400, body=b'{"error": "unknown hook"}'))  # dead while the page is open
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique,
                                      kinds={"file": write_hook_kind(tmp_path, http_server.url)}, console=CONSOLE)
    engine = make_engine(pg_url)
    ok1, ok2, flaky, bad = add_hooks(engine, ["ok", "ok", "flaky", "bad"], datetime.now(UTC) - timedelta(hours=1))

    with running_pipeline(settings), running_console(settings, sample_every_s=2) as console, chromium() as driver:
        sweep(settings)
        eventually(lambda: {k: v[0] for k, v in ledger(engine).items()} == {
            ok1: "applied", ok2: "applied", flaky: "applied", bad: "dead_letter"} and unsent(engine) == 0,
            timeout_s=60, what="the run settled: three applied (one after a retry), one dead letter, outbox sent")
        rows = ledger(engine)
        assert rows[flaky][:3] == ("applied", 2, "temporary") and rows[bad][:3] == ("dead_letter", 1, "invalid")

        # The overview shows the figures `lapse status --json` shows, with the findings the
        # reconciler's pass and the audit recorded.
        reconciled = lapse_json(settings, "reconcile", "--once")
        audited = lapse_json(settings, "audit", "--from-beginning")
        status = status_json(settings)
        assert status["findings"]["reconciler"]["details"] == reconciled
        assert status["findings"]["audit"]["details"]["verdict"] == audited["verdict"] == "invariants hold"
        sign_in(driver, console.url, OPERATOR[1])
        expected_lag = {(r["group"], r["topic"]): r["records"] for r in status["lag"]}

        def shown_now() -> dict:  # the console's lag reading is up to 5 s old (shared by its pages and sampler)
            driver.refresh()
            return shown_figures(driver)
        shown = eventually(lambda: (f := shown_now())["lag"] == expected_lag and f, timeout_s=30,
                           what="the console's lag reading as fresh as the CLI's")
        assert shown["ledger"] == status["ledger"] == {"applied": {"notify-hook": 3}, "dead_letter": {"notify-hook": 1}}
        assert (shown["dead_letters"], shown["expired_claims"], shown["outbox_unsent"]) == (
            status["dead_letters"], status["expired_claims"]["count"], status["outbox"]["unsent"]) == (1, 0, 0)
        assert shown["lag"] == {(r["group"], r["topic"]): r["records"] for r in status["lag"]}
        assert shown["members"] == {r["group"]: r["group_state"]["members"] for r in status["lag"]}
        assert shown["members"][settings.topology.groups.cleanup] >= 1  # the running worker
        assert shown["reconciler"].startswith(status["findings"]["reconciler"]["summary"])
        assert shown["audit"] == "invariants hold"
        assert shown["verdict"] == "degraded"  # a dead letter waits for an operator
        assert driver.find_element(By.CSS_SELECTOR, f'#lag tr[data-group="{settings.topology.groups.analytics}"]'
                                   ).get_attribute("data-judged") == "no"  # never started: shown, not judged
        charts = {c.get_attribute("id"): c for c in driver.find_elements(By.CSS_SELECTOR, "figure.chart")}
        assert set(charts) == {"throughput-chart", "dead-letters-chart", "eligible-chart", "lag-chart"}
        bars = charts["throughput-chart"].find_elements(By.CSS_SELECTOR, "rect.bar")
        assert bars and any("dead letter 1" in b.find_element(By.TAG_NAME, "title").get_attribute("textContent")
                            for b in bars)
        assert charts["dead-letters-chart"].find_elements(By.CSS_SELECTOR, "circle.point")
        screenshot(driver, "overview")

        # Live: the page follows the pipeline without reloading (the window keeps its own marker).
        driver.get(console.url + "/?every=2")
        driver.execute_script("window.keptAcrossUpdates = 'yes'")
        (late,) = add_hooks(engine, ["late"], datetime.now(UTC) - timedelta(minutes=5), first_id=5)
        sweep(settings)
        eventually(lambda: driver.find_element(By.ID, "dead-letters").get_attribute("data-value") == "2",
                   timeout_s=60, what="the overview's dead letters updated in place")
        assert driver.execute_script("return window.keptAcrossUpdates") == "yes"  # never reloaded
        assert int(driver.execute_script("return document.body.dataset.updates")) >= 1
        eventually(lambda: driver.find_elements(By.CSS_SELECTOR, "#eligible-chart circle.point")
                   and driver.find_elements(By.CSS_SELECTOR, "#lag-chart circle.point"), timeout_s=30,
                   what="sampled age and lag points")
        chart_screenshot(driver, "console-charts-hour")
        driver.find_element(By.ID, "window-day").click()
        eventually(lambda: driver.find_elements(By.CSS_SELECTOR, '#charts[data-window="day"]'), timeout_s=15,
                   what="the day's charts")
        chart_screenshot(driver, "console-charts-day")

        driver.get(console.url + "/dead-letters")
        listed = [r.get_attribute("data-op-key") for r in driver.find_elements(By.CSS_SELECTOR,
                                                                               "#dead-letter-list tr[data-op-key]")]
        assert listed == [bad, late]
        screenshot(driver, "dead-letters")

        # Found by its op key: the whole history on one page.
        box = driver.find_element(By.ID, "search-box")
        box.send_keys(bad)
        box.submit()
        eventually(lambda: driver.find_elements(By.CSS_SELECTOR, ".dead-letter"), timeout_s=15, what="the history")
        page = driver.find_element(By.TAG_NAME, "main").text
        assert bad in page and "unknown hook" in page and "Dead letter: invalid" in page
        screenshot(driver, "operation")

        # A viewer cannot replay (a valid form token, the wrong role); a form without its token is refused.
        with httpx.Client(base_url=console.url, headers={"Authorization": f"Bearer {VIEWER[1]}"}) as viewer:
            token = csrf_of(viewer.get("/dead-letters").text)
            refused = viewer.post("/dead-letters/replay/confirm",
                                  data={"csrf_token": token, "op_key": bad, "reason": "viewer tries"})
            assert refused.status_code == 403 and "needs an operator token" in refused.text
        with httpx.Client(base_url=console.url, headers={"Authorization": f"Bearer {OPERATOR[1]}"}) as operator:
            forged = operator.post("/dead-letters/replay/confirm", data={"op_key": bad, "reason": "no token"})
            assert forged.status_code == 403 and "CSRF" in forged.text
        assert ledger(engine)[bad][0] == "dead_letter" and actions(engine) == []

        # The operator replays it through the pages: ticked, counted (dry run), confirmed with a reason.
        driver.get(console.url + "/dead-letters")
        driver.find_element(By.CSS_SELECTOR, f'input[name="op_key"][value="{bad}"]').click()
        driver.find_element(By.ID, "replay-selected").click()
        preview = eventually(lambda: driver.find_elements(By.ID, "would-release"), timeout_s=15, what="the dry run")
        assert preview[0].get_attribute("data-value") == "1"
        assert ledger(engine)[bad][0] == "dead_letter"  # the dry run changed nothing
        screenshot(driver, "replay-preview")
        driver.find_element(By.ID, "reason").send_keys("the hook is registered now")
        driver.find_element(By.ID, "confirm-replay").click()
        replay_id = eventually(lambda: driver.find_elements(By.ID, "replay-id"), timeout_s=15,
                               what="the replay's page")[0].text
        assert replay_id.startswith("replay-")

        eventually(lambda: ledger(engine)[bad][0] == "applied", timeout_s=60, what="the replayed dead letter applied")
        assert ledger(engine)[bad] == ("applied", 1, "invalid", replay_id)
        ((action, actor, reason, details),) = actions(engine)
        assert (action, actor, reason) == ("dlq_replay", "alice", "the hook is registered now")
        assert (details["replay_id"], details["op_keys"], details["released"]) == (replay_id, [bad], 1)
        driver.refresh()
        assert driver.find_element(By.CSS_SELECTOR, f'#progress tr[data-op-key="{bad}"] .state').text == "applied"
        screenshot(driver, "replay")

        enqueue_report(engine, datetime.now(UTC).date(), datetime.now(UTC))  # today's, as `lapse report --date`
        driver.get(console.url + "/activity")
        assert driver.find_element(By.CSS_SELECTOR, "#actions .actor").text == "alice"
        reports = driver.find_elements(By.CSS_SELECTOR, "#reports tr[data-report]")
        assert [r.get_attribute("data-report") for r in reports] == [f"daily-report:{datetime.now(UTC).date()}"]
        screenshot(driver, "activity")
        assert OPERATOR[1] not in driver.page_source and VIEWER[1] not in driver.page_source  # never rendered
    engine.dispose()


@pytest.mark.slow
def test_dead_letters_grouped_paged_and_replayed_all_at_once_and_found_by_business_id(kafka_bootstrap, pg_url,
                                                                                       unique):
    """135 dead letters: the page says how many match and groups them; 100 on the first page, 35 on
    the next; "every one matching" takes them all (under the replay bound of 500) after its dry
    run; a tenant's operations are listed and one is found by its business id."""
    engine = make_engine(pg_url)
    now = datetime.now(UTC)
    keys = make_dead_letters(engine, [f"x{i:03}" for i in range(130)], "t1", now)
    keys += make_dead_letters(engine, [f"y{i:03}" for i in range(5)], "t2", now)
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, console=CONSOLE)
    with running_console(settings) as console, chromium() as driver:
        sign_in(driver, console.url, OPERATOR[1])
        driver.get(console.url + "/dead-letters")
        assert driver.find_element(By.ID, "dead-letter-total").get_attribute("data-value") == "135"
        groups = driver.find_elements(By.CSS_SELECTOR, "#dead-letter-groups tr[data-count]")
        assert sum(int(g.get_attribute("data-count")) for g in groups) == 135
        first = driver.find_elements(By.CSS_SELECTOR, "#dead-letter-list tr[data-op-key]")
        assert len(first) == 100
        screenshot(driver, "dead-letters-grouped")
        driver.find_element(By.ID, "next-page").click()
        eventually(lambda: driver.find_elements(By.ID, "first-page"), timeout_s=15, what="the second page")
        second = driver.find_elements(By.CSS_SELECTOR, "#dead-letter-list tr[data-op-key]")
        assert len(second) == 35 and not driver.find_elements(By.ID, "next-page")

        driver.find_element(By.ID, "replay-all").click()
        preview = eventually(lambda: driver.find_elements(By.ID, "would-release"), timeout_s=15, what="the dry run")
        assert preview[0].get_attribute("data-value") == "135"
        assert set(ledger(engine)[k][0] for k in keys) == {"dead_letter"}  # the dry run changed nothing
        driver.find_element(By.ID, "reason").send_keys("the partner fixed its subjects")
        driver.find_element(By.ID, "confirm-replay").click()
        replay_id = eventually(lambda: driver.find_elements(By.ID, "replay-id"), timeout_s=15,
                               what="the replay's page")[0].text
        rows = ledger(engine)
        assert {rows[k][3] for k in keys} == {replay_id} and {rows[k][0] for k in keys} == {"pending"}
        ((action, actor, _, details),) = actions(engine)
        assert (action, actor, details["released"], len(details["op_keys"])) == ("dlq_replay", "alice", 135, 135)

        driver.get(console.url + "/search")
        driver.find_element(By.ID, "search-tenant").send_keys("t2")
        driver.find_element(By.ID, "list-tenant").click()
        listed = eventually(lambda: driver.find_elements(By.CSS_SELECTOR, "#tenant-operations tr[data-op-key]"),
                            timeout_s=15, what="the tenant's operations")
        assert [r.get_attribute("data-op-key") for r in listed] == keys[130:]
        driver.get(console.url + "/search")
        driver.find_element(By.ID, "search-kind").send_keys("release-reservation")
        driver.find_element(By.ID, "search-subject").send_keys("y002")
        driver.find_element(By.ID, "find-subject").click()
        eventually(lambda: "/operations/" in driver.current_url, timeout_s=15, what="the operation's page")
        assert driver.find_element(By.CSS_SELECTOR, "section.operation").get_attribute("data-op-key") == keys[132]
    engine.dispose()


def test_without_tokens_the_console_serves_loopback_only():
    settings = Settings(console={"bind": "0.0.0.0"})
    with pytest.raises(ValueError, match="no tokens"):
        create_app(settings)
    result = CliRunner().invoke(main, ["console", "--bind", "0.0.0.0"])
    assert result.exit_code == 3 and "no tokens" in result.output, result.output


def test_every_statement_the_console_adds_reads_an_index(pg_url):
    """The console's own reads (dead letters by filter and page, their groups, throughput and the
    charts' buckets, reports, an action, the states of a replay's op keys, an operation by business
    id, a tenant's operations), captured as they run and EXPLAINed with sequential scans priced out:
    none scans the ledger, the transitions, the reports or the actions. (The status figures and the
    history are the CLI's, checked by test_status_scale and test_show.) The plans on a 2,000,000-row
    ledger, and their times, are in docs/performance.md."""
    engine = make_engine(pg_url)
    now = datetime.now(UTC)
    captured: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    with engine.connect() as conn:
        filtered_dead_letters(conn, kind="k", tenant="t", failure_class="invalid", since=now - timedelta(days=1),
                              until=now, limit=200)
        filtered_dead_letters(conn, after=(now, "k:1"), replayed=False, limit=200)
        dead_letter_groups(conn, failure_class="invalid")
        throughput(conn, now)
        transition_buckets(conn, now - timedelta(days=1), now, 1800)
        daily_reports(conn)
        operator_action(conn, 1)
        ledger_states(conn, ["k:1", "k:2"])
        operation_of_subject(conn, "k", "1")
        tenant_operations(conn, "t1", "k", "k:100", 50)
        tenant_operations(conn, "t1", None, None, 50)
    event.remove(engine, "before_cursor_execute", capture)
    assert len(captured) == 12
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plans = ["\n".join(conn.exec_driver_sql("EXPLAIN " + sql, params).scalars()) for sql, params in captured]
    for (sql, _), text in zip(captured, plans, strict=True):
        assert "Seq Scan" not in text, f"{sql}\n{text}"
    assert all("ix_lapse_ledger_dead_letters" in p for p in plans[:3])
    assert all("ix_lapse_transitions_at" in p for p in plans[3:6])
    assert "pk_lapse_daily_reports" in plans[6] and "pk_lapse_operator_actions" in plans[7]
    assert "pk_lapse_ledger" in plans[8]
    assert "ix_lapse_ledger_kind_subject" in plans[9]
    assert "ix_lapse_ledger_tenant" in plans[10] and "ix_lapse_ledger_tenant" in plans[11]
    engine.dispose()
