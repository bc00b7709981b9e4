"""The Faust baseline: an idiomatic faust-streaming agent doing the same lean per-event work as the
naive consumer (lapse.devtools.bench.lean: one transaction of the hand-written statements per
record, never `apply_batch`; offsets committed by Faust), in a worker subprocess.

Run as `python -m lapse.devtools.bench.faust_stage` with its arguments as JSON on stdin (they hold the
database URL and the Kafka secrets, which a command line would show to every local user); `run_faust`
starts it and watches the ledger. The worker reaches Kafka with the run's security settings, mapped
to Faust by lapse.kernel.connections.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from lapse.devtools.bench.lean import LeanSql, apply_one, driver_connection
from lapse.devtools.bench.ledger_watch import run_watched
from lapse.kernel.codec import Codec
from lapse.kernel.connections import faust_connection
from lapse.kernel.database import engine_from_settings
from lapse.kernel.ledger import ExpiryEvent
from lapse.kernel.schema_names import EXPIRY_EVENT
from lapse.kernel.settings import KafkaSettings, Settings, load_settings

if TYPE_CHECKING:
    import faust


def run_faust(settings: Settings, events: int) -> dict[str, Any]:
    """Start the Faust worker on the stage's expiry topic (its app id is the stage's cleanup group);
    stop it once `events` rows are done."""
    faust_connection(settings.kafka)  # refuses a security Faust cannot take before the worker starts
    datadir = tempfile.mkdtemp(prefix="lapse-bench-faust-")
    args = {"kafka": _plain(settings.kafka), "database_url": settings.database.url_plain(),
            "schemas_dir": str(settings.schemas.dir), "registry_url": settings.schemas.registry_url,
            "topics_file": str(settings.topics.file), "topic_prefix": settings.topics.prefix,
            "schema_name": settings.database.schema_name, "datadir": datadir}
    engine = engine_from_settings(settings)
    try:
        return run_watched([sys.executable, "-m", "lapse.devtools.bench.faust_stage"], args, engine, events,
                           datadir, "faust worker")
    finally:
        engine.dispose()
        shutil.rmtree(datadir, ignore_errors=True)


def _plain(kafka: KafkaSettings) -> dict[str, Any]:
    """The Kafka settings as JSON values, secrets included (they go to the worker through a pipe)."""
    def value(v: Any) -> Any:
        if isinstance(v, SecretStr):
            return v.get_secret_value()
        if isinstance(v, dict):
            return {k: value(x) for k, x in v.items()}
        return str(v) if isinstance(v, Path) else v
    return {name: value(getattr(kafka, name)) for name in kafka.model_fields_set}


def _worker(args: dict[str, Any]) -> None:
    """The Faust app: one agent over the expiry topic, one transaction per event."""
    import faust  # function-local: faust is slow to import and only this subprocess needs it

    settings = load_settings(
        kafka=args["kafka"],
        database={"url": args["database_url"], "schema_name": args["schema_name"]},
        schemas={"dir": args["schemas_dir"], "registry_url": args["registry_url"]},
        topics={"file": args["topics_file"], "prefix": args["topic_prefix"]})
    codec = Codec.from_settings(settings)
    engine = engine_from_settings(settings)
    _, conn = driver_connection(engine)  # held for the worker's life
    sql, topology = LeanSql.for_engine(engine), settings.topology
    app = faust.App(topology.groups.cleanup, **faust_connection(settings.kafka), store="memory://",
                    datadir=args["datadir"],
                    web_enabled=False, topic_disable_leader=True, consumer_auto_offset_reset="earliest",
                    broker_session_timeout=6.0, broker_heartbeat_interval=1.0)
    source = app.topic(topology.expiry, value_type=bytes, value_serializer="raw")

    @app.agent(source)
    async def cleanup(stream: faust.StreamT[bytes]) -> None:
        async for value in stream:
            now = datetime.now(UTC)
            event = ExpiryEvent.from_record(codec.decode_expected(EXPIRY_EVENT, value))
            try:
                apply_one(conn, sql, event, worker="bench-faust", outcomes_topic=topology.outcomes, now=now)
                conn.commit()
            except BaseException:
                conn.rollback()
                raise

    logging.getLogger("faust").setLevel(logging.WARNING)
    faust.Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    _worker(json.loads(sys.stdin.read()))
