"""The archive and the topics as one history (Apache Kafka, PostgreSQL, moto's S3 server as a process):
after `lapse archive` ran, the topics are trimmed (their log start moved past every record, as
retention moves it); the audit without the archive fails naming the gaps, with it passes; `lapse
show --archive` tells an operation whose ledger row and transitions were pruned; one archive file
removed, another altered, and the audit fails naming each. An archive URL that cannot be written
is one line and exit 3."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from confluent_kafka import TopicPartition
from sqlalchemy import delete

from lapse.devtools.brokers import free_port
from lapse.devtools.demo_data import add_reservations
from lapse.kernel.database import make_engine
from lapse.kernel.ledger import expiry_event
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from lapse.kernel.settings import REPO_ROOT
from lapse.shell.app import main
from tests.fixtures.kafka import admin, end_offsets
from tests.fixtures.pipeline import connection_env, make_pipeline_settings
from tests.fixtures.processes import role_env, run_lapse
from tests.fixtures.readers import READER_TOPICS, produce_events, relay, sweep
from tests.fixtures.workers import process_until_done

RESERVATIONS = 12


def _cli(settings, args: list[str], **env: str) -> tuple[int, str]:
    environment = {**connection_env(settings), "LAPSE_RUNTIME__LOG_LEVEL": "WARNING", **env}
    result = CliRunner().invoke(main, args, env=environment)
    return result.exit_code, result.stdout


def _audit(settings, *args: str, **env: str) -> tuple[int, dict]:
    code, out = _cli(settings, ["audit", "--from-beginning", "--grace", "0s", "--no-record", "--json", *args], **env)
    assert code in (0, 1), out
    return code, json.loads(out.splitlines()[-1])


def _trim(settings, topic: str, partitions: int) -> None:
    """Move the topic's log start past every record (DeleteRecords to the end)."""
    ends = end_offsets(settings.kafka.bootstrap_servers, topic, partitions)
    client = admin(settings.kafka.bootstrap_servers)
    futures = client.delete_records([TopicPartition(topic, p, end) for p, end in ends.items() if end])
    for future in futures.values():
        future.result(15)


@pytest.mark.slow
def test_the_audit_reads_the_archive_and_the_trimmed_topics_as_one_history(kafka_bootstrap, pg_url, unique, tmp_path,
                                                                          moto_server):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS)
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        ids = add_reservations(conn, RESERVATIONS, expires_at=datetime.now(UTC) - timedelta(minutes=10))
    sweep(settings)
    produce_events(settings, [expiry_event("release-reservation", "not-a-number", "t1",
                                           datetime.now(UTC) - timedelta(minutes=5), source="sweep")])
    process_until_done(settings, terminal=RESERVATIONS + 1)
    relay(settings)

    bucket = moto_server.bucket()
    url = f"s3://{bucket}/lapse/archive"
    store = {"LAPSE_ARCHIVE__ENDPOINT_URL": moto_server.endpoint_url}
    (done,) = run_lapse(["archive", "--exit-when-idle", "2"], cwd=REPO_ROOT,
                        env=role_env(settings, **{"archive.url": url, "archive.endpoint_url": moto_server.endpoint_url,
                                                  "archive.file_span_s": 1, "archive.close_after_s": 0}))
    assert done.code == 0, done.stderr[-10:]
    _trim(settings, settings.topology.expiry, 3)
    _trim(settings, settings.topology.dlq, 1)

    code, alone = _audit(settings)
    assert (code, alone["verdict"]) == (1, "incomplete")
    assert {(g["topic"], g["first_offset"]) for g in alone["gaps"]} == {
        (settings.topology.expiry, 0), (settings.topology.dlq, 0)}

    code, report = _audit(settings, "--archive", url, **store)
    assert (code, report["verdict"], report["gaps"]) == (0, "invariants hold", []), report["incomplete"]
    assert report["archived"][settings.topology.expiry] == report["events_seen"] == RESERVATIONS + 1
    assert (report["final_by_status"], report["without_terminal"]) == (
        {"applied": RESERVATIONS, "dead_letter": 1}, 0)

    # An operation whose ledger row and transitions were pruned still has its history.
    op_key = f"release-reservation:{ids[0]}"
    with engine.begin() as conn:
        conn.execute(delete(ledger_transitions).where(ledger_transitions.c.op_key == op_key))
        conn.execute(delete(cleanup_ledger).where(cleanup_ledger.c.op_key == op_key))
    engine.dispose()
    code, out = _cli(settings, ["show", op_key, "--archive", url, "--json"], **store)
    assert code == 0, out
    shown = json.loads(out)
    assert shown["ledger"] is None
    assert [(t["from_state"], t["to_state"]) for t in shown["transitions"]] == [("pending", "applied")]
    assert [(r["role"], r["from"]) for r in shown["archive"]["records"]] == [("expiry", "archive"),
                                                                             ("outcomes", "topic")]
    assert shown["archive"]["records"][1]["record"]["status"] == "applied"

    # One archive file removed, another altered: each is a gap the audit names.
    client = moto_server.client
    files = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="lapse/archive/topics/")["Contents"]
                   if o["Key"].endswith(".avro") and f"{settings.topology.expiry}/" in o["Key"])
    client.delete_object(Bucket=bucket, Key=files[0])
    client.put_object(Bucket=bucket, Key=files[-1], Body=b"Obj\x01 not the file the manifest describes")
    code, damaged = _audit(settings, "--archive", url, **store)
    assert (code, damaged["verdict"]) == (1, "incomplete")
    reasons = sorted(g["reason"].rsplit(": ", 1)[1] for g in damaged["gaps"])
    assert reasons == ["altered (its SHA-256 or size is not the manifest's)", "missing"]
    assert all(g["first_time"] is not None for g in damaged["gaps"])
    code, allowed = _audit(settings, "--archive", url, "--allow-gaps", **store)
    assert (code, len(allowed["gaps"])) == (0, 2)


def test_an_archive_url_that_cannot_be_written_is_one_line_and_exit_3(kafka_bootstrap, pg_url, unique, tmp_path,
                                                                      moto_server):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS)
    (tmp_path / "a-file").write_text("not a folder")
    closed = f"http://127.0.0.1:{free_port()}"
    runs = {url: CliRunner().invoke(main, ["archive", "--url", url, "--exit-when-idle", "1"], env={
                **connection_env(settings), "LAPSE_ARCHIVE__ENDPOINT_URL": endpoint})
            for url, endpoint in (("ftp://example.com/archive", moto_server.endpoint_url),
                                  (f"file://{tmp_path / 'a-file'}/archive", moto_server.endpoint_url),
                                  ("s3://no-such-bucket-here/archive", moto_server.endpoint_url),
                                  ("s3://lapse-bucket/archive", closed))}
    lines = {url: result.stderr.splitlines() for url, result in runs.items()}
    assert [result.exit_code for result in runs.values()] == [3, 3, 3, 4], lines
    assert all(len(said) == 1 and said[0].startswith("lapse: ") for said in lines.values()), lines
    said = [found[0] for found in lines.values()]
    assert "give s3://bucket/prefix or file:///path" in said[0]
    assert "Not a directory" in said[1]
    assert "NoSuchBucket" in said[2]
    assert closed.removeprefix("http://") in said[3]
