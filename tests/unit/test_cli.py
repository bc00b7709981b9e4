"""The CLI: every setting flag names its env var in --help; a wrong value is one clear line."""

from __future__ import annotations

from click.testing import CliRunner

from lapse.shell.app import main


def test_help_shows_each_flags_env_var():
    result = CliRunner().invoke(main, ["process", "--help"])
    assert result.exit_code == 0
    for var in ("LAPSE_KAFKA__BOOTSTRAP_SERVERS", "LAPSE_DATABASE__URL", "LAPSE_PROCESSOR__BATCH_SIZE",
                "LAPSE_TOPICS__PREFIX"):
        assert var in result.output


def test_wrong_setting_is_one_line_naming_the_variable():
    result = CliRunner().invoke(main, ["sweep", "--once", "--page-size", "0"])
    assert result.exit_code == 2
    last = result.output.strip().splitlines()[-1]
    assert "producer.sweep_page_size" in last and "LAPSE_PRODUCER__SWEEP_PAGE_SIZE" in last


def test_wrong_env_value_is_reported_too(monkeypatch):
    monkeypatch.setenv("LAPSE_KAFKA__SECURITY_PROTOCOL", "CARRIER_PIGEON")
    result = CliRunner().invoke(main, ["sweep", "--once"])
    assert result.exit_code == 2
    assert "LAPSE_KAFKA__SECURITY_PROTOCOL" in result.output
    assert "Traceback" not in result.output
