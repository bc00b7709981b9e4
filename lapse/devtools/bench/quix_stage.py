"""The Quix Streams peer's stage: `quix_peer` run by the Python of its own environment (`make
quix-peer` makes it: quixstreams pins an older confluent-kafka than Lapse's), on the stage's
expiry topic, cleanup group and database, stopped once the ledger shows every event done. Its
arguments go as JSON on stdin (they hold the database URL). Without that environment the stage
fails with a line saying how to make it, and the run goes on."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from lapse.devtools.bench.bound import BATCH_COLUMNS, SetBasedSql
from lapse.devtools.bench.ledger_watch import StageFailed, run_watched
from lapse.devtools.demo_tables import reservations
from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings, qualified_name
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.kernel.schema_names import EXPIRY_EVENT
from lapse.kernel.settings import Settings

DEFAULT_PYTHON = Path("build/quix-venv/bin/python")
PEER = Path(__file__).with_name("quix_peer.py")  # run as a file: its environment has no Lapse
PARTITION_BATCH = 500  # rows per partition per checkpoint: the sink's transactions hold about this many


def run_quix(settings: Settings, events: int, python: Path = DEFAULT_PYTHON, partitions: int = 4) -> dict[str, Any]:
    """Start the peer on the stage's expiry topic; stop it once `events` ledger rows are done."""
    if not python.is_file():
        raise StageFailed(f"no Quix Streams environment at {python}: run `make quix-peer`")
    if settings.kafka.security_protocol != "PLAINTEXT":
        raise StageFailed("the Quix Streams peer connects in plaintext only")
    engine = engine_from_settings(settings)
    state_dir = tempfile.mkdtemp(prefix="lapse-bench-quix-")
    sql = SetBasedSql.for_names(qualified_name(engine, cleanup_ledger), qualified_name(engine, ledger_transitions),
                                qualified_name(engine, outbox), qualified_name(engine, reservations))
    args = {"bootstrap": settings.kafka.bootstrap_servers, "group": settings.topology.groups.cleanup,
            "topic": settings.topology.expiry, "outcomes": settings.topology.outcomes, "worker": "bench-quix",
            "dsn": settings.database.url_plain().replace("postgresql+psycopg://", "postgresql://", 1),
            "schema": Codec.from_settings(settings).store.current[EXPIRY_EVENT].schema_json,
            "sql": sql.as_dict(), "types": [kind for _, kind in BATCH_COLUMNS],
            "commit_every": PARTITION_BATCH * partitions, "state_dir": state_dir}
    try:
        result = run_watched([str(python.absolute()), str(PEER)], args, engine, events, state_dir, "quix peer")
    finally:
        engine.dispose()
        shutil.rmtree(state_dir, ignore_errors=True)
    return {**result, "batch_size": PARTITION_BATCH}
