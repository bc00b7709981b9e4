"""The console's Brakes page in a real headless Chromium (docs/design/brakes.md): an operator
pauses a kind through the form, sees it with the work waiting under it, and resumes it, which
releases that work; each is an operator action recorded with the operator's name. A viewer sees
the page but has no forms; a shadow run's records are shown. The page is saved to
build/console-screenshots/brakes.png."""

from __future__ import annotations

from dataclasses import replace

from selenium.webdriver.common.by import By
from sqlalchemy import insert, select

from lapse.devtools.demo_kinds import packaged_kinds_file
from lapse.devtools.demo_tables import reservations
from lapse.kernel.database import make_engine
from lapse.kernel.models import cleanup_ledger, operator_actions, pauses
from lapse.processors.rules import apply_batch
from tests.fixtures.console import chromium, running_console, screenshot
from tests.fixtures.fast_path import RELEASE, release_event, reservation, scope
from tests.fixtures.kinds import demo_kinds
from tests.fixtures.pipeline import make_pipeline_settings
from tests.fixtures.polling import eventually

OPERATOR, VIEWER = ("alice", "op-token-4f1c9a7e2b3d5f60"), ("victor", "view-token-9b2e61d04c7a")
CONSOLE = {"operator_tokens": {OPERATOR[0]: OPERATOR[1]}, "viewer_tokens": {VIEWER[0]: VIEWER[1]}}


def sign_in_to(driver, url: str, token: str, page: str) -> None:
    driver.get(f"{url}/login?next={page}")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "sign-in").click()
    eventually(lambda: driver.current_url.endswith(page) and driver.find_elements(By.CSS_SELECTOR, "main h1"),
               timeout_s=30, what=f"{page} after signing in")


def states(engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(cleanup_ledger.c.op_key, cleanup_ledger.c.state)).all())


def test_an_operator_pauses_and_resumes_a_kind_in_the_browser(kafka_bootstrap, pg_url, unique):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, kinds={"file": packaged_kinds_file()},
                                      console=CONSOLE)
    engine = make_engine(pg_url)
    kinds = demo_kinds(engine)
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(i) for i in (1, 2, 3)])
    # One operation recorded by a shadow run of the kind, for the page's shadow section.
    with engine.begin() as conn:
        apply_batch(scope(conn, {**kinds, RELEASE: replace(kinds[RELEASE], mode="shadow")}), [release_event(3)])

    with running_console(settings) as console, chromium() as driver:
        sign_in_to(driver, console.url, OPERATOR[1], "/brakes")
        # nothing paused yet (waited for: the URL changes before the page's document has loaded)
        eventually(lambda: driver.find_elements(By.CSS_SELECTOR, "#pauses tr.none"), timeout_s=30,
                   what="the Brakes page with nothing paused")
        driver.find_element(By.CSS_SELECTOR, f"#pause-kind option[value='{RELEASE}']").click()
        driver.find_element(By.ID, "pause-reason").send_keys("partner outage")
        driver.find_element(By.ID, "pause-submit").click()
        row = eventually(lambda: driver.find_elements(By.CSS_SELECTOR, f"#pauses tr[data-kind='{RELEASE}']"),
                         timeout_s=30, what="the pause listed")[0]
        assert row.get_attribute("data-cause") == "operator" and "alice" in row.text and "partner outage" in row.text

        # Work of the paused kind arrives: it is held, and the page counts it.
        with engine.begin() as conn:
            held = apply_batch(scope(conn, kinds), [release_event(1), release_event(2)])
        assert len(held.held) == 2
        driver.refresh()
        waiting = driver.find_element(By.CSS_SELECTOR, f"#pauses tr[data-kind='{RELEASE}'] .waiting")
        assert waiting.get_attribute("data-value") == "2"
        shadow = driver.find_element(By.CSS_SELECTOR, f"section.shadow[data-kind='{RELEASE}'] [data-outcome='apply']")
        assert shadow.text == "1"
        screenshot(driver, "brakes")

        row = driver.find_element(By.CSS_SELECTOR, f"#pauses tr[data-kind='{RELEASE}']")
        row.find_element(By.NAME, "reason").send_keys("partner back")
        row.find_element(By.CSS_SELECTOR, "form.resume button").click()
        eventually(lambda: driver.find_elements(By.CSS_SELECTOR, "#pauses tr.none"), timeout_s=30,
                   what="the pause gone from the page")

        # A viewer sees the page, without the forms.
        driver.delete_all_cookies()
        sign_in_to(driver, console.url, VIEWER[1], "/brakes")
        assert not driver.find_elements(By.ID, "pause-form")

    # The resume released every parked row whose brake is off: the two held, and the shadowed one
    # (the kinds file has the kind live).
    assert set(states(engine).values()) == {"pending"}
    with engine.connect() as conn:
        assert conn.execute(select(pauses)).all() == []
        recorded = [(a.action, a.actor, a.reason, a.details.get("via")) for a in conn.execute(
            select(operator_actions).order_by(operator_actions.c.id))]
    assert recorded == [("pause", "alice", "partner outage", "console"), ("resume", "alice", "partner back", "console")]
    engine.dispose()
