"""The console's read-only JSON API and probes, through an HTTP client against the console served by
uvicorn on PostgreSQL (and Apache Kafka where a page reads the broker): the API gives the pages'
data (dead letters grouped, totalled and paged; search by business id and by tenant; the overview
and its charts; 404 for what is not there); `/healthz` answers while the process runs and
`/readyz` while the database does; with the database down every page is a clear 503 page and the
log has one line, no traceback."""

from __future__ import annotations

import logging
import re
import socket
from datetime import UTC, datetime
from urllib.parse import quote

import httpx
from sqlalchemy import func, select

from lapse.kernel.database import make_engine
from lapse.kernel.models import ledger_transitions
from lapse.kernel.settings import load_settings
from tests.fixtures.console import make_dead_letters, running_console
from tests.fixtures.pipeline import make_pipeline_settings

OPERATOR = ("alice", "op-4f1c9a7e2b3d5f60c8e1")
BEARER = {"Authorization": f"Bearer {OPERATOR[1]}"}


def test_the_api_gives_the_pages_data_and_404_for_what_is_missing(kafka_bootstrap, pg_url, unique):
    engine = make_engine(pg_url)
    now = datetime.now(UTC)
    keys = make_dead_letters(engine, [f"x{i:03}" for i in range(130)], "t1", now)
    keys += make_dead_letters(engine, [f"y{i:03}" for i in range(5)], "t2", now)
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, console={
        "operator_tokens": {OPERATOR[0]: OPERATOR[1]}})
    with running_console(settings) as console, httpx.Client(base_url=console.url, headers=BEARER) as api:
        assert api.get("/api/v1/dead-letters", headers={"Authorization": "Bearer wrong"}).status_code == 401
        first = api.get("/api/v1/dead-letters").json()
        assert first["total"] == 135 and not first["total_capped"]
        assert sum(g["count"] for g in first["groups"]) == 135
        assert {g["kind"] for g in first["groups"]} == {"release-reservation"}
        assert len(first["dead_letters"]) == 100 and first["next"]
        second = api.get("/api/v1/dead-letters", params=first["next"]).json()
        assert second["next"] is None
        listed = [r["op_key"] for r in first["dead_letters"] + second["dead_letters"]]
        assert sorted(listed) == sorted(keys) and len(set(listed)) == 135  # every one once, over two pages
        shown = api.get("/dead-letters")
        csp = shown.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe" not in csp  # the one script is a file of the console
        assert "<script src=\"/static/console.js\"" in shown.text and api.get("/static/console.js").status_code == 200
        page = shown.text
        assert 'id="dead-letter-total" data-value="135"' in page and 'id="next-page"' in page
        assert len(re.findall(r'<tr data-op-key=', page)) == 100
        tenant_two = api.get("/api/v1/dead-letters", params={"tenant": "t2"}).json()
        assert tenant_two["total"] == 5 and len(tenant_two["dead_letters"]) == 5

        # Search: by business id (kind and subject id), a tenant's operations a page at a time.
        found = api.get("/api/v1/search", params={"kind": "release-reservation", "subject": "y003"}).json()
        assert found["found"]["operations"] == [{"op_key": "release-reservation:y003"}]
        redirected = api.get("/search", params={"kind": "release-reservation", "subject": "y003"})
        assert redirected.status_code == 303
        assert redirected.headers["location"] == "/operations/" + quote("release-reservation:y003", safe="")
        nothing = api.get("/search", params={"kind": "release-reservation", "subject": "nope"})
        assert nothing.status_code == 200 and 'id="nothing-found"' in nothing.text
        tenant = api.get("/api/v1/search", params={"tenant": "t2"}).json()["tenant_page"]
        assert [r["op_key"] for r in tenant["operations"]] == [k for k in keys if ":y" in k]
        assert tenant["next"] is None

        # One operation, and 404 for one that does not exist (page and API), and for an action.
        one = api.get(f"/api/v1/operations/{quote(keys[0], safe='')}").json()
        assert one["h"]["ledger"]["state"] == "dead_letter"
        assert api.get("/operations/release-reservation:none").status_code == 404
        missing = api.get("/api/v1/operations/release-reservation:none")
        assert missing.status_code == 404 and "no operation" in missing.json()["error"]
        assert api.get("/actions/999").status_code == 404

        # The overview: the status figures, the verdict and the charts' series of the last hour.
        overview = api.get("/api/v1/overview").json()
        assert overview["status"]["dead_letters"] == 135
        charts = overview["charts"]
        with engine.connect() as conn:
            made = conn.execute(select(func.count()).where(ledger_transitions.c.to_state == "dead_letter")).scalar_one()
        assert sum(charts["throughput"]["dead_letter"]) == made == 135
        assert charts["dead_letters_waiting"][-1] == 135 and len(charts["buckets"]) == 60
        day = api.get("/api/v1/charts", params={"window": "day"}).json()
        assert day["step_s"] == 1800 and len(day["buckets"]) == 48
        assert sum(day["throughput"]["dead_letter"]) == 135  # the open half hour, summed from its minutes
        # The analytics group that `lapse run` never starts is shown, never judged.
        judged = {row["group"]: row["judged"] for row in overview["status"]["lag"]}
        assert judged[settings.topology.groups.analytics] is False
        assert judged[settings.topology.groups.cleanup] is True
    engine.dispose()


def test_probes_answer_for_the_process_and_for_the_database(pg_url):
    settings = load_settings(database={"url": pg_url})
    with running_console(settings) as console, httpx.Client(base_url=console.url) as client:
        assert client.get("/healthz").text == "ok\n"
        assert client.get("/readyz").status_code == 200


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_with_the_database_down_pages_say_so_and_the_log_has_one_line(caplog):
    url = f"postgresql+psycopg://lapse@127.0.0.1:{_closed_port()}/lapse"
    settings = load_settings(database={"url": url, "connect_timeout_s": 1})
    caplog.set_level(logging.INFO)
    with running_console(settings) as console, httpx.Client(base_url=console.url) as client:
        caplog.clear()
        pages = [client.get(path) for path in ("/activity", "/activity", "/search?kind=k&subject=1")]
        assert [p.status_code for p in pages] == [503, 503, 503]
        assert all("<title>Database unreachable" in p.text and "Traceback" not in p.text for p in pages)
        api = client.get("/api/v1/activity")
        assert api.status_code == 503 and api.json()["error"].startswith("Database unreachable")
        assert client.get("/readyz").status_code == 503
        assert client.get("/healthz").status_code == 200
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("lapse")]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "the database is unavailable" in lines[0].getMessage() and lines[0].exc_info is None
    assert not [r for r in caplog.records if r.exc_info]  # no traceback from uvicorn or Starlette either
