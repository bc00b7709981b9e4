"""The CLI: every setting flag names its env var in --help; a wrong value is one clear line."""

from __future__ import annotations

import json
import sys

from click.testing import CliRunner

from lapse.shell.app import main
from lapse.shell.extras import installed, require_extra


def test_help_shows_each_flags_env_var():
    result = CliRunner().invoke(main, ["process", "--help"])
    assert result.exit_code == 0
    for var in ("LAPSE_KAFKA__BOOTSTRAP_SERVERS", "LAPSE_DATABASE__URL", "LAPSE_PROCESSOR__BATCH_SIZE",
                "LAPSE_TOPICS__PREFIX"):
        assert var in result.output


def test_wrong_setting_is_one_line_naming_the_variable():
    result = CliRunner().invoke(main, ["sweep", "--once", "--page-size", "0"])
    assert result.exit_code == 3
    last = result.output.strip().splitlines()[-1]
    assert "producer.sweep_page_size" in last and "LAPSE_PRODUCER__SWEEP_PAGE_SIZE" in last


def test_wrong_env_value_is_reported_too(monkeypatch):
    monkeypatch.setenv("LAPSE_KAFKA__SECURITY_PROTOCOL", "CARRIER_PIGEON")
    result = CliRunner().invoke(main, ["sweep", "--once"])
    assert result.exit_code == 3
    assert "LAPSE_KAFKA__SECURITY_PROTOCOL" in result.output
    assert "Traceback" not in result.output


def test_a_flat_name_from_before_the_sections_is_refused_with_the_new_one(monkeypatch):
    monkeypatch.setenv("LAPSE_BOOTSTRAP_SERVERS", "kafka-1:9092")
    result = CliRunner().invoke(main, ["sweep", "--once"])
    assert result.exit_code == 3
    last = result.output.strip().splitlines()[-1]
    assert "unknown setting LAPSE_BOOTSTRAP_SERVERS" in last and "LAPSE_KAFKA__BOOTSTRAP_SERVERS" in last
    assert "Traceback" not in result.output


def test_a_misspelt_setting_is_refused_and_test_plumbing_is_not(monkeypatch):
    monkeypatch.setenv("LAPSE_TEST_ANYTHING", "fine")
    monkeypatch.setenv("LAPSE_KAFKA__SECURITY_PROTOCAL", "SASL_SSL")
    result = CliRunner().invoke(main, ["sweep", "--once"])
    assert result.exit_code == 3
    assert "LAPSE_KAFKA__SECURITY_PROTOCAL" in result.output and "LAPSE_KAFKA__SECURITY_PROTOCOL" in result.output


def test_version_is_the_installed_distributions():
    from importlib.metadata import version

    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"lapse {version('lapse')}\n"


def test_config_is_a_root_option_that_every_command_sees(tmp_path, monkeypatch):
    monkeypatch.delenv("LAPSE_KAFKA__BOOTSTRAP_SERVERS", raising=False)
    config = tmp_path / "site.toml"
    config.write_text('[kafka]\nbootstrap_servers = "kafka-9:9092"\n')
    result = CliRunner().invoke(main, ["--config", str(config), "config", "show"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("kafka.bootstrap_servers "))
    assert line.split() == ["kafka.bootstrap_servers", "kafka-9:9092", "(file", f"{config})"]
    assert "--config FILE" in CliRunner().invoke(main, ["--help"]).output


def test_run_with_the_console_refuses_a_public_bind_without_tokens_before_starting_anything(monkeypatch):
    monkeypatch.setenv("LAPSE_CONSOLE__BIND", "0.0.0.0")
    result = CliRunner().invoke(main, ["run", "--console"])
    assert result.exit_code == 3
    assert result.output.count("\n") == 1
    assert "the console would serve 0.0.0.0 with no tokens" in result.output


def test_help_lists_the_dev_tools_in_their_own_section():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    commands, _, dev_tools = result.output.partition("\nDev tools:\n")
    listed = {line.split()[0] for line in dev_tools.splitlines() if line.strip()}
    assert listed == {"bench", "broker", "demo", "soak"}
    assert "  run " in commands and "  dlq " in commands and "  demo " not in commands


def test_shell_completion_is_served_by_the_command():
    """docs/install.md tells to `eval "$(_LAPSE_COMPLETE=bash_source lapse)"`: what it evaluates, and
    the completions it then asks for."""
    script = CliRunner().invoke(main, [], env={"_LAPSE_COMPLETE": "bash_source"}, prog_name="lapse")
    assert script.exit_code == 0 and "complete -o nosort -F _lapse_completion lapse" in script.output
    words = CliRunner().invoke(main, [], prog_name="lapse", env={
        "_LAPSE_COMPLETE": "bash_complete", "COMP_WORDS": "lapse dlq list --k", "COMP_CWORD": "3"})
    assert words.output.split() == ["plain,--kind"]


def test_analytics_without_its_extra_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "faust", None)  # as if faust-streaming were not installed
    result = CliRunner().invoke(main, ["analytics"])
    assert result.exit_code == 3
    assert result.stderr == ("lapse: analytics needs the `analytics` extra (faust is not installed): "
                             "pip install 'lapse[analytics]'\n")


def test_an_extra_imported_already_counts_as_installed():
    """Faust swaps its module for one without `__spec__` (find_spec raises ValueError for it): a
    command needing the extra in a process that imported Faust still runs (the bench's Faust stage)."""
    import faust  # noqa: F401

    assert installed("faust") and not installed("lapse_no_such_module")
    require_extra("analytics", "faust")  # does not raise


def test_debug_asks_the_logs_for_whole_tracebacks():
    plain = json.loads(CliRunner().invoke(main, ["config", "show", "--json"]).output)
    debug = json.loads(CliRunner().invoke(main, ["--debug", "config", "show", "--json"]).output)
    assert plain["settings"]["runtime"]["log_tracebacks"]["value"] is False
    assert debug["settings"]["runtime"]["log_tracebacks"]["value"] is True
