"""`lapse db`: offline SQL without connecting, a one-line refusal without a configured database,
and the revision and migrations as JSON (on an SQLite file)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from lapse.shell.app import main

NOWHERE = "postgresql+psycopg://lapse:s3cret@127.0.0.1:1/nowhere"  # nothing listens on port 1


def _invoke(*args: str):
    return CliRunner(env={"LAPSE_DATABASE__URL": None}).invoke(main, list(args))


def test_upgrade_sql_prints_a_fresh_install_in_the_schema_without_connecting():
    result = _invoke("db", "upgrade", "--sql", "--database-url", NOWHERE, "--schema-name", "lapse_alt")

    assert result.exit_code == 0, result.output
    sql = result.output
    assert "CREATE SCHEMA IF NOT EXISTS lapse_alt" in sql
    assert sql.index("CREATE SCHEMA") < sql.index("CREATE TABLE lapse_alt.lapse_alembic_version")
    for table in ("lapse_ledger", "lapse_transitions", "lapse_outbox", "lapse_daily_reports",
                  "lapse_operator_actions"):
        assert f"CREATE TABLE lapse_alt.{table} (" in sql
    assert "reservations" not in sql and "artifacts" not in sql and "s3cret" not in sql
    assert "INSERT INTO lapse_alt.lapse_alembic_version (version_num) VALUES ('0004')" in sql
    assert "UPDATE lapse_alt.lapse_alembic_version SET version_num='0014' WHERE" in sql


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
        None, None, "0014", False)
    assert upgraded.output == f"{url}: none → 0014\n"
    assert (after["revision"], after["at_head"], after["schema"]) == ("0014", True, None)
    assert [(h["revision"], h["down_revision"], h["head"]) for h in history] == [
        ("0014", "0009", True), ("0009", "0008", False), ("0008", "0007", False), ("0007", "0006", False),
        ("0006", "0005", False), ("0005", "0004", False), ("0004", None, False)]
    assert "tenant" in history[0]["summary"]
    assert "Time partitions" in history[1]["summary"]
    assert "retention" in history[3]["summary"]
    assert "operator actions" in history[4]["summary"]
    assert "indexes" in history[5]["summary"]
    assert "namespace" in history[6]["summary"]
