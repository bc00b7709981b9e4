"""`lapse bench` refuses a bad option with one line, before it starts anything."""

from __future__ import annotations

from click.testing import CliRunner

from lapse.shell.app import main


def test_wrong_batch_sizes_is_a_one_line_error():
    result = CliRunner().invoke(main, ["bench", "--batch-sizes", "100,abc"])
    assert result.exit_code == 2
    assert "expected comma-separated integers" in result.output
    assert "Traceback" not in result.output
