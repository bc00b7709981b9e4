"""`lapse db`: offline SQL without connecting, a one-line refusal without a configured database,
and the revision and migrations as JSON (on an SQLite file)."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

from alembic.script import ScriptDirectory
from click.testing import CliRunner

from lapse.kernel.database import alembic_config
from lapse.shell.app import main

HEAD = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
NOWHERE = "postgresql+psycopg://lapse:s3cret@127.0.0.1:1/nowhere"  # nothing listens on port 1


def _invoke(*args: str):
    return CliRunner(env={"LAPSE_DATABASE__URL": None}).invoke(main, list(args))


def test_upgrade_sql_prints_a_fresh_install_in_the_schema_without_connecting():
    result = CliRunner(env={"LAPSE_DATABASE__URL": NOWHERE}).invoke(
        main, ["db", "upgrade", "--sql", "--schema-name", "lapse_alt"])

    assert result.exit_code == 0, result.output
    sql = result.output
    assert "CREATE SCHEMA IF NOT EXISTS lapse_alt" in sql
    assert sql.index("CREATE SCHEMA") < sql.index("CREATE TABLE lapse_alt.lapse_alembic_version")
    for table in ("lapse_ledger", "lapse_transitions", "lapse_outbox", "lapse_daily_reports",
                  "lapse_operator_actions"):
        assert f"CREATE TABLE lapse_alt.{table} (" in sql
    assert "reservations" not in sql and "artifacts" not in sql and "s3cret" not in sql
    assert "INSERT INTO lapse_alt.lapse_alembic_version (version_num) VALUES ('0004')" in sql
    assert f"UPDATE lapse_alt.lapse_alembic_version SET version_num='{HEAD}' WHERE" in sql


def test_db_commands_refuse_the_implicit_default_database_in_one_line(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for command in (["db", "upgrade"], ["db", "upgrade", "--sql"], ["db", "current"]):
        result = _invoke(*command)
        assert result.exit_code == 3
        assert result.output.startswith("lapse: no database configured: set database.url (LAPSE_DATABASE__URL)")
        assert result.output.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # no SQLite file made on the side


def test_current_and_history_as_json(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'lapse.db'}"

    before = json.loads(_invoke("db", "current", "--json", "--database-url", url).output)
    upgraded = _invoke("db", "upgrade", "--database-url", url)
    after = json.loads(_invoke("db", "current", "--json", "--database-url", url).output)
    history = json.loads(_invoke("db", "history", "--json").output)

    assert (before["revision"], before["legacy_revision"], before["head"], before["at_head"]) == (
        None, None, HEAD, False)
    assert upgraded.output == f"{url}: none → {HEAD}\n"
    assert (after["revision"], after["at_head"], after["schema"]) == (HEAD, True, None)
    # Newest first, one chain from the head down to 0004, each revision's summary its docstring's.
    revisions = [(h["revision"], h["down_revision"], h["head"]) for h in history]
    assert revisions[0] == (HEAD, revisions[1][0], True)
    assert revisions[-1] == ("0004", None, False)
    assert all(down == below for (_, down, _), (below, _, _) in pairwise(revisions))
    summaries = {h["revision"]: h["summary"] for h in history}
    assert "Time partitions" in summaries["0009"]
    assert "brakes" in summaries["0010"]
    assert "Partition rotation" in summaries["0011"]
    assert "tenant" in summaries["0014"]
    assert "generation" in summaries["0018"].lower()
    assert "limit" in summaries["0017"].lower()
    assert "retention" in summaries["0007"]
    assert "operator actions" in summaries["0006"]
    assert "indexes" in summaries["0005"]
    assert "namespace" in summaries["0004"]
