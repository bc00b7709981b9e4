"""The daily report's edges that need no database: the file notifier keeps the first report for a
key, and a bad `--date` is a one-line error."""

from __future__ import annotations

import json

from click.testing import CliRunner

from lapse.reconciler.notifiers import FileNotifier
from lapse.shell.app import main


def test_file_notifier_keeps_the_first_report_for_a_key(tmp_path):
    notifier = FileNotifier(tmp_path)
    notifier.send("daily-report:2026-11-28", {"op_keys": 1})
    notifier.send("daily-report:2026-11-28", {"op_keys": 2})
    (only,) = tmp_path.glob("*.json")
    assert json.loads(only.read_text())["report"] == {"op_keys": 1}


def test_bad_date_is_a_one_line_error(tmp_path):
    env = {"LAPSE_DATABASE__URL": "sqlite:///" + str(tmp_path / "x.db"), "LAPSE_REPORT__DIR": str(tmp_path),
           "LAPSE_RUNTIME__LOG_FORMAT": "text"}
    result = CliRunner().invoke(main, ["report", "--date", "28/11/2026"], env=env)
    assert result.exit_code == 2
    assert "Invalid value for '--date'" in result.output
    assert "Traceback" not in result.output
