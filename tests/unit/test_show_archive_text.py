"""`lapse show --archive`'s text for an operation whose ledger row was pruned: a header that says so,
then one timeline of its archived transitions and its records from the archive and the topics, and
the archive files that could not be read."""

from __future__ import annotations

from lapse.shell.commands.show import history_text


def test_a_pruned_operation_is_told_from_the_archive_and_the_topics():
    history = {
        "op_key": "release-reservation:7", "ledger": None, "outbox": [], "replay_ids": [], "dead_letter": None,
        "transitions": [{"id": 3, "at": "2026-12-01T10:00:01.000Z", "from_state": "pending", "to_state": "applied",
                         "attempt": 1, "actor": "worker-1", "failure_class": None, "reason": None,
                         "replay_id": None, "event_topic": "lapse.expiry", "event_partition": 2, "event_offset": 5}],
        "archive": {"url": "s3://b/a", "damaged": ["archive file topics/x.avro: missing"], "records": [
            {"topic": "lapse.expiry", "role": "expiry", "partition": 2, "offset": 5, "at": "2026-12-01T10:00:00.000Z",
             "from": "archive", "record": {"attempt": 0, "due_at": "2026-12-01T09:59:00.000Z", "source": "sweep"}},
            {"topic": "lapse.outcomes", "role": "outcomes", "partition": 1, "offset": 9,
             "at": "2026-12-01T10:00:02.000Z", "from": "topic", "record": {"status": "applied", "attempt": 1}},
        ]},
    }
    assert history_text(history).splitlines() == [
        "release-reservation:7  no ledger row (pruned, or never written): the archive's history follows",
        "timeline:",
        "  2026-12-01T10:00:00.000Z  <- lapse.expiry[2]@5 (archive): event attempt 0 due 2026-12-01T09:59:00.000Z "
        "(sweep)",
        "  2026-12-01T10:00:01.000Z  pending -> applied  attempt 1  by worker-1  event lapse.expiry[2]@5",
        "  2026-12-01T10:00:02.000Z  <- lapse.outcomes[1]@9 (topic): outcome applied attempt 1",
        "  ARCHIVE FILE NOT READ: archive file topics/x.avro: missing",
    ]
