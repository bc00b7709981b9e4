"""The analytics Faust app (group `lapse-analytics`): figures over lapse.outcomes, served as JSON.

Per one-minute tumbling window (of the outcome's time) it counts outcomes by kind and status and
dead letters by kind and failure class; over all time it keeps attempts per completion and a
latency histogram (due time → applied) per kind, from which the view reads p50/p95/p99 (served by
Faust's web server at `runtime.web_bind`, 127.0.0.1 unless configured). Records are
read in batches with `stream.take()` and decoded with lapse.kernel.codec.

Tables use the key partitioner, so a key's changelog partition does not depend on the partition
its outcome came from: one analytics worker holds and recovers every figure exactly. Counts are
at-least-once (a relay repeat of one outcome counts twice); `lapse audit` is the exact account.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lapse.kernel.codec import Codec, DecodeError
from lapse.kernel.connections import faust_connection
from lapse.kernel.ledger import APPLIED, DEAD_LETTER, TERMINAL, millis
from lapse.kernel.schema_names import CLEANUP_OUTCOME
from lapse.kernel.settings import Settings
from lapse.readers.offsets import manual_consumer, partitions_of

if TYPE_CHECKING:
    import faust
    from faust.web import Request, Response, View

# The figures by table name: "windows", "totals", … → key → count (Faust tables, or plain dicts).
Tables = Mapping[str, MutableMapping[str, int]]

WINDOW_MS = 60_000
LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 21600, 86400)
VIEW_PATH = "/lapse/analytics/"


@dataclass(frozen=True)
class AnalyticsOptions:
    app_id: str = "lapse-analytics"
    web_port: int = 6066
    data_dir: Path = Path(".lapse/faust")
    replication_factor: int = 1
    window_retention: timedelta = timedelta(hours=1)
    batch: int = 500


def window_start(ms: int) -> int:
    return ms - ms % WINDOW_MS


def latency_bucket(seconds: float) -> int:
    """Index of the first bucket bound >= seconds; len(bounds) is the overflow bucket."""
    return bisect_left(LATENCY_BUCKETS_S, max(0.0, seconds))


def percentile(buckets: dict[int, int], q: float) -> float | None:
    """Upper bound (seconds) of the bucket holding the q-quantile; inf for the overflow bucket."""
    total = sum(buckets.values())
    if not total:
        return None
    seen = 0
    for index in sorted(buckets):
        seen += buckets[index]
        if seen >= q * total:
            return LATENCY_BUCKETS_S[index] if index < len(LATENCY_BUCKETS_S) else float("inf")
    return float("inf")


def fold(tables: Tables, record: dict[str, Any]) -> None:
    """Add one decoded outcome to the tables (any mapping with int values per key)."""
    kind, status = record["kind"], record["status"]
    at = millis(record["occurred_at"])
    tables["windows"][f"{kind}|{status}|{window_start(at)}"] += 1
    tables["totals"][f"{kind}|{status}"] += 1
    if status in TERMINAL:
        tables["attempts"][f"{kind}|{record['attempt']}"] += 1
    if status == APPLIED:
        seconds = (at - millis(record["due_at"])) / 1000
        tables["latency"][f"{kind}|{latency_bucket(seconds)}"] += 1
    if status == DEAD_LETTER:
        tables["dead_letters"][f"{kind}|{record.get('failure_class') or 'unknown'}|{window_start(at)}"] += 1


def snapshot(tables: Tables) -> dict[str, Any]:
    """The JSON the view serves, built from the tables' current contents."""
    windows = []
    for key, n in tables["windows"].items():
        kind, status, start = key.rsplit("|", 2)
        windows.append({"start": _iso(int(start)), "kind": kind, "status": status, "count": n})
    attempts: dict[str, dict[str, int]] = {}
    for key, n in tables["attempts"].items():
        kind, attempt = key.rsplit("|", 1)
        attempts.setdefault(kind, {})[attempt] = n
    buckets: dict[str, dict[int, int]] = {}
    for key, n in tables["latency"].items():
        kind, index = key.rsplit("|", 1)
        buckets.setdefault(kind, {})[int(index)] = n
    growth = []
    for key, n in tables["dead_letters"].items():
        kind, failure_class, start = key.rsplit("|", 2)
        growth.append({"start": _iso(int(start)), "kind": kind, "failure_class": failure_class, "count": n})
    return {
        "totals": dict(sorted(tables["totals"].items())),
        "windows": sorted(windows, key=lambda w: (w["start"], w["kind"], w["status"])),
        "attempts_per_completion": {
            kind: {"by_attempt": dict(sorted(c.items())),
                   "mean": round(sum(int(a) * n for a, n in c.items()) / sum(c.values()), 3)}
            for kind, c in sorted(attempts.items())},
        "latency_due_to_applied_s": {
            kind: {"count": sum(b.values()), "p50": percentile(b, 0.5), "p95": percentile(b, 0.95),
                   "p99": percentile(b, 0.99)} for kind, b in sorted(buckets.items())},
        "dead_letter_growth": sorted(growth, key=lambda g: (g["start"], g["kind"], g["failure_class"])),
        "undecodable": tables["undecodable"].get("all", 0),
    }


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _prune(tables: Tables, now: datetime, keep: timedelta) -> None:
    """Drop one-minute windows older than `keep` (the totals stay)."""
    oldest = millis(now - keep)
    for name in ("windows", "dead_letters"):
        table = tables[name]
        for key in [k for k in list(table.keys()) if int(k.rsplit("|", 1)[1]) < oldest]:
            del table[key]


def build_app(settings: Settings, options: AnalyticsOptions, partitions: int) -> faust.App:
    """The Faust app over settings.topology.outcomes; `partitions` is that topic's partition count.
    It reaches Kafka with the same security as the librdkafka clients (lapse.kernel.connections),
    or refuses to be built (ConnectionRefused) when that security cannot be mapped to Faust."""
    import faust  # function-local: faust takes a second to import; `lapse --help` must not

    codec = Codec.from_settings(settings)
    app = faust.App(
        options.app_id, **faust_connection(settings.kafka), store="memory://",
        key_serializer="json", value_serializer="json", datadir=str(options.data_dir), web_port=options.web_port,
        web_bind=settings.runtime.web_bind,
        topic_partitions=partitions, topic_replication_factor=options.replication_factor,
        consumer_auto_offset_reset="earliest", topic_disable_leader=True,
        broker_session_timeout=settings.processor.session_timeout_ms / 1000,
        broker_heartbeat_interval=max(0.5, settings.processor.session_timeout_ms / 5000),
    )
    source = app.topic(settings.topology.outcomes, key_type=bytes, key_serializer="raw",
                       value_type=bytes, value_serializer="raw")
    names = ("windows", "totals", "attempts", "latency", "dead_letters", "undecodable")
    tables = {name: app.Table(name.replace("_", "-"), default=int, key_type=str, value_type=int,
                              partitions=partitions, use_partitioner=True)
              for name in names}

    @app.agent(source)
    async def outcomes(stream: faust.StreamT[bytes]) -> None:
        # A table write picks its changelog partition from the producer's cached metadata, which
        # does not know a changelog topic the worker has just created: on a fresh cluster with
        # outcomes waiting, the first write raised TypeError and its batch was lost. Wait for them.
        producer = app.producer._ensure_producer()  # type: ignore[attr-defined]  # faust's aiokafka driver
        for table in tables.values():
            await producer.partitions_for(table.changelog_topic.get_topic_name())
        async for batch in stream.take(options.batch, within=1.0):
            for value in batch:
                try:
                    record = codec.decode_expected(CLEANUP_OUTCOME, value)
                except DecodeError:
                    tables["undecodable"]["all"] += 1
                    continue
                fold(tables, record)

    @app.timer(interval=60.0)
    async def prune() -> None:
        _prune(tables, datetime.now(UTC), options.window_retention)  # a display's windows: the local clock

    @app.page(VIEW_PATH)
    async def view(page: View, request: Request) -> Response:
        return page.json(snapshot(tables))

    return app


def run_analytics(settings: Settings, options: AnalyticsOptions) -> None:
    """Run the Faust worker until SIGTERM/SIGINT."""
    import faust  # function-local: faust takes a second to import; `lapse --help` must not

    faust_connection(settings.kafka)  # refuses, before anything connects, a security Faust cannot take
    consumer = manual_consumer(settings)
    try:
        partitions = len(partitions_of(consumer, settings.topology.outcomes))
    finally:
        consumer.close()
    app = build_app(settings, options, partitions)
    faust.Worker(app, loglevel=settings.runtime.log_level, quiet=True).execute_from_commandline()
