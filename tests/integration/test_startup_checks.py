"""Start-up checks as an operator meets them: `lapse` subprocesses that refuse in one line with exit 3
before any work, on Apache Kafka and PostgreSQL.

The database one migration behind is built honestly: the real previous revision (0003, in the
layout before Lapse's namespace) made by the frozen migrations the fixtures keep, exactly what a
deployment that skipped `lapse db upgrade` has; it lacks today's migrations (0004 on).
A database at 0004, behind in today's layout, is refused the same way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from sqlalchemy import text

from lapse.kernel.codec import Codec
from lapse.kernel.database import VERSION_TABLE, make_engine, upgrade_url
from lapse.kernel.settings import REPO_ROOT, env_var, load_settings
from lapse.shell.error_boundary import ExitCode
from lapse.shell.startup_checks import StartupRefused, check_database
from tests.fixtures.db import build_legacy_layout, migrations_head
from tests.fixtures.kafka import committed, end_offsets
from tests.fixtures.pipeline import (
    EXPIRY_PARTITIONS,
    Pipeline,
    connection_env,
    expiry_event,
    make_pipeline_settings,
    produce,
)
from tests.fixtures.polling import eventually
from tests.fixtures.processes import Finished, run_lapse

BOUND_S = 60.0  # every refusal comes long before this; a role that starts instead runs past it


def committed_offsets(bootstrap: str, group: str, topic: str) -> set[int]:
    """The group's committed offsets on `topic`, asked again while the coordinator is still loading
    (a fresh group's first look-up can answer NOT_COORDINATOR)."""

    def ask() -> set[int] | None:
        try:
            return set(committed(bootstrap, group, topic, EXPIRY_PARTITIONS).values())
        except KafkaException:
            return None

    return eventually(ask, timeout_s=60, interval_s=1, what="the committed offsets")


def assert_refused(done: Finished, *parts: str) -> None:
    what = f"lapse {' '.join(done.args)}"
    assert (done.code, len(done.stderr)) == (ExitCode.CONFIG, 1), f"{what}: exit {done.code}, {done.stderr}"
    for part in parts:
        assert part in done.stderr[0], f"{what}: {done.stderr[0]}"


@pytest.mark.slow
def test_a_database_one_migration_behind_is_refused_by_every_role_before_any_batch(
        kafka_bootstrap, pg_empty_url, unique, tmp_path):
    build_legacy_layout(pg_empty_url, "0003")
    settings = make_pipeline_settings(kafka_bootstrap, pg_empty_url, unique)
    engine = make_engine(pg_empty_url)
    try:
        produce(Pipeline(settings, engine, Codec.from_settings(settings)), [expiry_event(1), expiry_event(2)])
    finally:
        engine.dispose()
    env = connection_env(settings)
    for args in (["process", "--exit-when-idle", "5"], ["relay", "--exit-when-idle", "1"], ["sweep", "--once"],
                 ["sweep"], ["run", "--workers", "1"]):
        assert_refused(run_lapse(args, env=env, cwd=tmp_path, bound_s=BOUND_S)[0],
                       f"lapse: database at revision legacy 0003, this Lapse needs {migrations_head()}: "
                       "run `lapse db upgrade`")
    topic, group = settings.topology.expiry, settings.topology.groups.cleanup
    assert sum(end_offsets(kafka_bootstrap, topic, EXPIRY_PARTITIONS).values()) == 2  # both still there
    assert committed_offsets(kafka_bootstrap, group, topic) == {-1001}  # none consumed


def copied_schemas(tmp_path: Path) -> Path:
    target = tmp_path / "schemas"
    shutil.copytree(REPO_ROOT / "schemas", target)
    return target


def test_an_incompatible_schema_edit_is_refused_naming_the_schema(kafka_bootstrap, pg_url, unique, tmp_path):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique)
    folder = copied_schemas(tmp_path)
    path = folder / "dead_letter.avsc"
    schema = json.loads(path.read_text())
    schema["fields"].append({"name": "severity", "type": "int"})  # no default: old records cannot fill it
    path.write_text(json.dumps(schema))
    env = {**connection_env(settings), env_var("schemas.dir"): str(folder)}
    for args in (["process", "--exit-when-idle", "5"], ["relay", "--exit-when-idle", "1"]):
        assert_refused(run_lapse(args, env=env, cwd=tmp_path, bound_s=BOUND_S)[0],
                       "lapse: schema dead_letter.avsc cannot read dead_letter.v1.avsc in history/: ",
                       "severity: a field the old schema lacks, with no default")
    topic, group = settings.topology.expiry, settings.topology.groups.cleanup
    assert committed_offsets(kafka_bootstrap, group, topic) == {-1001}


def test_a_topic_prefix_too_long_for_kafka_is_refused(pg_url, tmp_path):
    env = {env_var("database.url"): pg_url, env_var("topics.prefix"): "p" * 240,
           env_var("kafka.bootstrap_servers"): "127.0.0.1:9"}  # never reached: refused before
    for args in (["process", "--exit-when-idle", "1"], ["run", "--workers", "1"]):
        assert_refused(run_lapse(args, env=env, cwd=tmp_path, bound_s=BOUND_S)[0],
                       "lapse: topics.prefix (LAPSE_TOPICS__PREFIX) is 240 characters: with ", "over Kafka's 249")


def test_a_database_a_newer_lapse_migrated_is_refused_without_advising_an_upgrade(pg_url):
    """A revision this Lapse's migrations do not know (stamped here, as a newer release would
    leave it): `lapse db upgrade` could not help, so the refusal says which version to run."""
    engine = make_engine(pg_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE lapse.{VERSION_TABLE} SET version_num = '9999'"))
    finally:
        engine.dispose()
    with pytest.raises(StartupRefused) as refused:
        check_database(load_settings(database={"url": pg_url}))
    assert str(refused.value) == (f"database at revision 9999, unknown to this Lapse (it needs {migrations_head()}): "
                                  "a newer Lapse migrated it; run that version")


def test_a_database_at_the_previous_revision_is_refused_until_upgraded(pg_empty_url):
    """0004, a revision behind the head, migrated for real: refused with the
    advice to upgrade; after `lapse db upgrade` it passes."""
    assert upgrade_url(pg_empty_url, "0004").after == "0004"
    settings = load_settings(database={"url": pg_empty_url})
    with pytest.raises(StartupRefused) as refused:
        check_database(settings)
    head = migrations_head()
    assert str(refused.value) == f"database at revision 0004, this Lapse needs {head}: run `lapse db upgrade`"
    assert upgrade_url(pg_empty_url).after == head
    check_database(settings)
