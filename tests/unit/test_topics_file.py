"""topics.yaml read without a broker: a malformed file is a one-line error (also through
`lapse topics apply --dry-run`), and the delay tiers and groups come from the file."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from lapse.kernel.topology import TopicsFileError, declared_groups, delay_tiers, load_topics
from lapse.shell.app import main


@pytest.mark.parametrize("text, expected", [
    ("topics: [lapse.expiry", "not valid YAML"),
    ("topics:\n  lapse.expiry:\n    partitions: 0\n", "topics.lapse.expiry.partitions"),
    ("topics:\n  lapse.expiry:\n    partitions: 3\n    retention: two weeks\n", "retention"),
    ("topics:\n  lapse.expiry:\n    partitions: 3\n    partitons: 4\n", "partitons: unknown key"),
    ("topics:\n  'bad name!':\n    partitions: 3\n", "topic names use only"),
    ("tpoics: {}\n", "unknown key"),
])
def test_malformed_topics_file_is_a_one_line_error(tmp_path, text, expected):
    bad = tmp_path / "topics.yaml"
    bad.write_text(text)
    with pytest.raises(TopicsFileError) as err:
        load_topics(bad)
    assert expected in str(err.value) and str(bad) in str(err.value)
    assert "\n" not in str(err.value)

    result = CliRunner().invoke(main, ["topics", "apply", "--file", str(bad), "--dry-run"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: {err.value}"]


def test_delay_tiers_and_groups_come_from_the_file():
    assert delay_tiers() == [("30s", 30), ("2m", 120), ("10m", 600), ("1h", 3600)]
    assert declared_groups() == ["lapse-analytics", "lapse-cleanup", "lapse-delay", "lapse-reports"]
    by_name = {spec.name: spec for spec in load_topics()}
    assert by_name["lapse.expiry"].manual_readers == ("audit",)
    assert by_name["lapse.expiry"].replication_factor == 3
    assert by_name["lapse.expiry"].config["min.insync.replicas"] == "2"
