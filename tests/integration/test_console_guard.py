"""The console's own defences, through an HTTP client against the console served by uvicorn on
PostgreSQL: DNS rebinding (a foreign `Host` is refused, a foreign or missing `Origin` on a change),
TLS (HTTPS with a `Secure` session cookie; beyond loopback only with TLS), sign-in (rate-limited
per client and overall, weak tokens refused at start-up, signing out ends the session for every
copy of its cookie), and the open console's actor: the name the operator gives."""

from __future__ import annotations

import re
import ssl
from datetime import UTC, datetime

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from lapse.devtools.brokers.secured import make_certificates
from lapse.kernel.database import make_engine
from lapse.kernel.models import cleanup_ledger, operator_actions
from lapse.kernel.settings import load_settings
from lapse.shell.app import main
from lapse.shell.console.access import SESSION_COOKIE, SignInLimits
from tests.fixtures.console import make_dead_letters, running_console

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
OPERATOR = ("alice", "op-4f1c9a7e2b3d5f60c8e1")
VIEWER = ("victor", "view-9b2e61d04c7a8f35e2b0")
TOKENS = {"operator_tokens": {OPERATOR[0]: OPERATOR[1]}, "viewer_tokens": {VIEWER[0]: VIEWER[1]}}


def dead_letter(engine, i: int) -> str:
    (op_key,) = make_dead_letters(engine, [f"x{i}"], "t1", NOW)
    return op_key


def state_of(engine, op_key: str) -> str:
    with engine.connect() as conn:
        return conn.execute(select(cleanup_ledger.c.state).where(cleanup_ledger.c.op_key == op_key)).scalar_one()


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match, "no CSRF token on the page"
    return match.group(1)


def test_a_rebinding_page_can_neither_read_nor_change_the_open_console(pg_url, caplog):
    """The issue's reproduction: with no tokens, `Host: attacker.example` read the dead letters with
    their form token (200) and a POST with that Host and Origin discarded one (303). Now both are
    421, a foreign Origin with the console's own Host is 403, a post without Origin is 403, each
    one log line; the console's own origin still works."""
    engine = make_engine(pg_url)
    op_key = dead_letter(engine, 1)
    settings = load_settings(database={"url": pg_url})
    with running_console(settings) as console:
        port = console.url.rsplit(":", 1)[1]
        attacker = {"Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"}
        with httpx.Client(base_url=console.url) as client:
            caplog.clear()
            assert client.get("/activity", headers={"Host": attacker["Host"]}).status_code == 421
            token = csrf_of(client.get("/login").text)
            posted = client.post("/dead-letters/discard/confirm", headers=attacker,
                                 data={"csrf_token": token, "op_key": op_key, "reason": "rebound"})
            assert posted.status_code == 421
            foreign = client.post("/dead-letters/discard/confirm", headers={"Origin": "http://attacker.example"},
                                  data={"csrf_token": token, "op_key": op_key, "reason": "cross-site"})
            assert foreign.status_code == 403
            no_origin = client.post("/login", data={"csrf_token": token, "name": "mallory"})
            assert no_origin.status_code == 403
            refusals = [r for r in caplog.records if r.getMessage() == "console refused a request"]
            assert [r.status for r in refusals] == [421, 421, 403, 403]
            assert all(r.exc_info is None for r in refusals)
            assert state_of(engine, op_key) == "dead_letter"

            # The console's own names still answer: loopback literals and localhost.
            assert client.get("/activity", headers={"Host": f"localhost:{port}"}).status_code == 200
            own = {"Origin": console.url}
            signed = client.post("/login", headers=own, data={"csrf_token": token, "name": "olga", "next": "/activity"})
            assert signed.status_code == 303
            page = client.get("/activity").text
            assert "local:olga (operator)" in page
            done = client.post("/dead-letters/discard/confirm", headers=own, data={
                "csrf_token": csrf_of(page), "op_key": op_key, "reason": "checked by hand", "shown": "1"})
            assert done.status_code == 303, done.text
    assert state_of(engine, op_key) == "discarded"
    with engine.connect() as conn:
        (actor,) = conn.execute(select(operator_actions.c.actor)).scalars().all()
    assert actor == "local:olga"  # the name given, never the console's OS user
    engine.dispose()


def test_configured_host_names_are_answered_and_others_refused(pg_url):
    settings = load_settings(database={"url": pg_url}, console={"allowed_hosts": ["console.example.com"]})
    with running_console(settings) as console, httpx.Client(base_url=console.url) as client:
        assert client.get("/healthz", headers={"Host": "console.example.com"}).status_code == 200
        assert client.get("/healthz", headers={"Host": "console.example.com.evil.test"}).status_code == 421
        assert client.get("/healthz", headers={"Host": ""}).status_code == 421


def test_the_console_serves_tls_with_a_secure_cookie_and_only_tls_beyond_loopback(pg_url, tmp_path):
    tls = make_certificates(tmp_path / "tls", "unused")
    settings = load_settings(database={"url": pg_url}, console={
        **TOKENS, "tls_cert": str(tls.keystore), "tls_key": str(tls.keystore)})
    with running_console(settings) as console:
        assert console.url.startswith("https://")
        with httpx.Client(base_url=console.url, verify=ssl.create_default_context(cafile=str(tls.ca))) as client:
            token = csrf_of(client.get("/login").text)
            signed = client.post("/login", headers={"Origin": console.url},
                                 data={"csrf_token": token, "token": OPERATOR[1]})
            assert signed.status_code == 303
            cookie = signed.headers["set-cookie"].lower()
            assert all(flag in cookie for flag in ("secure", "httponly", "samesite=strict"))
            assert "strict-transport-security" in client.get("/activity").headers
        with pytest.raises(httpx.HTTPError), httpx.Client(base_url=console.url.replace("https", "http")) as plain:
            plain.get("/healthz")

    # Beyond loopback: refused without TLS (one line, exit 3), with tokens or not; served with it.
    runner = CliRunner()
    env = {"LAPSE_DATABASE__URL": pg_url, "LAPSE_CONSOLE__OPERATOR_TOKENS": f'{{"alice": "{OPERATOR[1]}"}}'}
    result = runner.invoke(main, ["console", "--bind", "0.0.0.0"], env=env)
    assert result.exit_code == 3 and result.output.count("\n") == 1, result.output
    assert "without TLS" in result.output
    broken = runner.invoke(main, ["console", "--bind", "0.0.0.0"], env={
        **env, "LAPSE_CONSOLE__TLS_CERT": str(tmp_path / "missing.pem"), "LAPSE_CONSOLE__TLS_KEY": str(tls.keystore)})
    assert broken.exit_code == 3 and "do not load" in broken.output and broken.output.count("\n") == 1


def test_sign_in_is_rate_limited_per_client_and_overall(pg_url):
    settings = load_settings(database={"url": pg_url}, console=TOKENS)
    limits = SignInLimits(per_client=3, overall=5, window_s=600)
    with running_console(settings, limits=limits) as console, httpx.Client(base_url=console.url) as client:
        own = {"Origin": console.url}
        token = csrf_of(client.get("/login").text)
        for _ in range(3):
            assert client.post("/login", headers=own, data={"csrf_token": token, "token": "wrong"}).status_code == 401
        limited = client.post("/login", headers=own, data={"csrf_token": token, "token": OPERATOR[1]})
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) > 0  # even the right token
        assert client.get("/activity", headers={"Authorization": f"Bearer {OPERATOR[1]}"}).status_code == 429

        # Other clients (here: other forwarded source addresses are not trusted, so another
        # process is the same client) meet the overall limit once it is spent.
        limits.per_client = 100
        for _ in range(2):
            assert client.get("/activity", headers={"Authorization": "Bearer nope"}).status_code == 401
        overall = client.get("/activity", headers={"Authorization": f"Bearer {VIEWER[1]}"})
        assert overall.status_code == 429


def test_weak_tokens_are_refused_at_start_up_in_one_line():
    runner = CliRunner()
    for tokens, said in (('{"alice": "x"}', "1 characters"), ('{"alice": "aaaaaaaaaaaaaaaaaaaa"}', "different"),
                         ('{"alice": "1234567890123456"}', "bits")):
        result = runner.invoke(main, ["console"], env={"LAPSE_CONSOLE__OPERATOR_TOKENS": tokens})
        assert result.exit_code == 3 and result.output.count("\n") == 1, result.output
        assert said in result.output and "alice" in result.output


def test_signing_out_ends_the_session_for_every_copy_of_its_cookie(pg_url):
    settings = load_settings(database={"url": pg_url}, console=TOKENS)
    with running_console(settings) as console, httpx.Client(base_url=console.url) as client:
        own = {"Origin": console.url}
        client.post("/login", headers=own, data={"csrf_token": csrf_of(client.get("/login").text),
                                                 "token": VIEWER[1]})
        copied = client.cookies[SESSION_COOKIE]
        page = client.get("/activity")
        assert page.status_code == 200 and "victor (viewer)" in page.text
        assert client.post("/logout", headers=own, data={"csrf_token": csrf_of(page.text)}).status_code == 303
        with httpx.Client(base_url=console.url, cookies={SESSION_COOKIE: copied}) as thief:
            again = thief.get("/activity")
            assert again.status_code == 303 and again.headers["location"].startswith("/login")
