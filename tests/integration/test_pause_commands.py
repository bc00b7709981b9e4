"""`lapse pause` and `lapse resume` as an operator types them, on PostgreSQL (no broker needed):
a pause recorded once with who and why, `status` showing it with the work waiting, a resume that
releases it; every wrong request one line with its exit code and nothing changed."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select, text

from lapse.devtools.demo_kinds import packaged_kinds_file
from lapse.devtools.demo_tables import reservations
from lapse.kernel.models import operator_actions, pauses
from lapse.shell.app import main
from tests.fixtures.fast_path import reservation

NO_TENANT_KINDS = """
kinds:
  purge-session:
    table: public.sessions_t
    id: id
    due: expires_at
    effect:
      delete: {}
"""


def invoke(url: str, kinds_file, *args: str):
    env = {"LAPSE_DATABASE__URL": url, "LAPSE_KINDS__FILE": str(kinds_file), "LAPSE_RUNTIME__LOG_LEVEL": "WARNING"}
    return CliRunner().invoke(main, list(args), env=env)


def counts(url: str) -> tuple[int, int]:
    from lapse.kernel.database import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return (conn.execute(select(func.count()).select_from(pauses)).scalar_one(),
                    conn.execute(select(func.count()).select_from(operator_actions)).scalar_one())
    finally:
        engine.dispose()


@pytest.fixture
def shop(pg_url, tmp_path):
    from lapse.kernel.database import make_engine

    engine = make_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(reservations.insert(), [reservation(1, tenant="acme")])
        conn.execute(text("CREATE TABLE public.sessions_t (id text PRIMARY KEY, expires_at timestamptz NOT NULL)"))
        conn.execute(text("CREATE INDEX sessions_t_due ON public.sessions_t (expires_at, id)"))
    engine.dispose()
    no_tenant = tmp_path / "no_tenant.yaml"
    no_tenant.write_text(NO_TENANT_KINDS)
    return pg_url, packaged_kinds_file(), no_tenant


def test_pause_status_and_resume_as_an_operator_types_them(shop):
    url, kinds, _ = shop
    paused = invoke(url, kinds, "pause", "release-reservation", "--tenant", "acme", "--reason", "migrating",
                    "--actor", "alice")
    assert paused.exit_code == 0, paused.output
    assert paused.output.startswith("paused release-reservation/acme (operator action ")
    again = invoke(url, kinds, "pause", "release-reservation", "--tenant", "acme", "--reason", "x", "--actor", "bob")
    assert again.exit_code == 0 and "was already paused" in again.output and "by alice" in again.output
    assert counts(url) == (1, 1)

    status = json.loads(invoke(url, kinds, "status", "--json", "--no-lag").output)
    (shown,) = status["brakes"]["pauses"]
    assert (shown["kind"], shown["tenant"], shown["cause"], shown["actor"], shown["reason"], shown["waiting"]) == (
        "release-reservation", "acme", "operator", "alice", "migrating", 0)
    assert "paused release-reservation/acme (operator)" in invoke(url, kinds, "status", "--no-lag").output

    resumed = invoke(url, kinds, "resume", "release-reservation", "--tenant", "acme", "--reason", "done",
                     "--actor", "alice", "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.output)["resumed"] is True
    assert counts(url) == (0, 2)


@pytest.mark.parametrize(("args", "kinds_slot", "message"), [
    (["pause", "no-such-kind", "--reason", "r", "--actor", "a"], 1, "lapse: pause: no kind 'no-such-kind' in "),
    (["pause", "release-reservation", "--tenant", "ghost", "--reason", "r", "--actor", "a"], 1,
     "lapse: pause: no row of reservations has tenant 'ghost'; add --new-tenant to pause it anyway"),
    (["pause", "purge-session", "--tenant", "acme", "--reason", "r", "--actor", "a"], 2,
     "lapse: pause: kind 'purge-session' has no tenant column; pause the whole kind"),
    (["pause", "release-reservation", "--reason", " ", "--actor", "a"], 1, "--reason must say why"),
    (["pause", "release-reservation", "--reason", "r", "--actor", "a", "--tenant", "x" * 65], 1,
     "--tenant must be 1 to 64 characters"),
    (["resume", "release-reservation", "--reason", "r", "--actor", "a"], 1,
     "lapse: resume: 'release-reservation' is not paused; nothing changed"),
])
def test_a_wrong_request_is_one_line_exit_2_and_changes_nothing(shop, args, kinds_slot, message):
    url = shop[0]
    done = invoke(url, shop[kinds_slot], *args)
    assert done.exit_code == 2, done.output
    assert message in done.output and done.output.strip().count("\n") <= 1, done.output
    assert counts(url) == (0, 0)


def test_a_tenant_that_has_no_row_yet_can_be_paused_on_purpose(shop):
    url, kinds, _ = shop
    done = invoke(url, kinds, "pause", "release-reservation", "--tenant", "newco", "--new-tenant",
                  "--reason", "onboarding", "--actor", "alice", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["pause"]["tenant"] == "newco"
