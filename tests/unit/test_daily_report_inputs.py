"""The daily report's edges that need no database: the file notifier keeps the first report for a
key, a bad `--date` is a one-line error, and which days a report pass looks at around midnight."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

from click.testing import CliRunner

from lapse.reports.daily_report import closes_at
from lapse.reports.notifiers import FileNotifier
from lapse.reports.report_schedule import days_to_report
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


def test_a_day_closes_after_midnight_plus_the_grace_period():
    grace = timedelta(minutes=5)
    assert closes_at(date(2026, 11, 28), grace) == datetime(2026, 11, 29, 0, 5, tzinfo=UTC)
    # Inside the margin, the day before is still open (rebuilt), and so is the new day.
    assert days_to_report(datetime(2026, 11, 29, 0, 2, tzinfo=UTC), grace) == [
        date(2026, 11, 27), date(2026, 11, 28), date(2026, 11, 29)]
    assert days_to_report(datetime(2026, 11, 29, 12, tzinfo=UTC), grace) == [date(2026, 11, 28), date(2026, 11, 29)]


def test_serve_with_a_date_is_a_usage_error(tmp_path):
    env = {"LAPSE_DATABASE__URL": "sqlite:///" + str(tmp_path / "x.db"), "LAPSE_REPORT__DIR": str(tmp_path),
           "LAPSE_RUNTIME__LOG_FORMAT": "text"}
    result = CliRunner().invoke(main, ["report", "--serve", "--date", "2026-11-28"], env=env)
    assert result.exit_code == 2
    assert "give --date or --serve, not both" in result.output
