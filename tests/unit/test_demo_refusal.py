"""`lapse demo` seeds and deletes data: it refuses a broker or database not on this machine before
starting or touching anything, unless --force. (The demo itself: tests/system/test_demo.py.)"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from lapse.devtools.commands.demo import remote_brokers, remote_database
from lapse.shell.app import main


def test_which_brokers_and_databases_are_on_this_machine():
    assert remote_brokers("localhost:9092, 127.0.0.1:9093,[::1]:9094,SSL://127.0.0.2:9095") == []
    assert remote_brokers("127.0.0.1:9092,kafka.example.com:9092,10.0.0.5:9092") == [
        "kafka.example.com:9092", "10.0.0.5:9092"]
    assert remote_database("sqlite:///somewhere/demo.db") is None
    assert remote_database("postgresql+psycopg://u:p@localhost:5432/db") is None
    assert remote_database("postgresql+psycopg://u@/db?host=/var/run/postgresql") is None
    assert remote_database("postgresql+psycopg://u:p@db.example.com/db") == "db.example.com"
    assert remote_database("postgresql+psycopg://u@127.0.0.1/db?host=10.1.2.3") == "10.1.2.3"


@pytest.mark.parametrize(("flags", "named"), [
    (["--bootstrap-servers", "kafka.example.com:9092"], "broker kafka.example.com:9092"),
    (["--database-url", "postgresql+psycopg://lapse@db.example.com:5432/prod"], "database host db.example.com"),
])
def test_demo_refuses_what_is_not_on_this_machine_before_anything(flags, named, tmp_path):
    state = tmp_path / "state"
    result = CliRunner().invoke(main, ["demo", "--state-dir", str(state), *flags])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"lapse: demo refused: {named} is not on this machine")
    assert "--force" in result.output and result.output.count("\n") == 1
    assert "s3cret" not in result.output
    assert not state.exists()  # nothing made, nothing started
