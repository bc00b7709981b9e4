"""The names of Lapse's schemas, said once: its Avro record schemas and its database schema.

The Avro names are the file stems in `schemas/` (what the codec encodes and decodes by) and what
the outbox's `schema` column says of each row. The database schema is where Lapse's tables live on
PostgreSQL by default, and the placeholder the models name (an engine translates it).
"""

from __future__ import annotations

EXPIRY_EVENT = "expiry_event"
CLEANUP_OUTCOME = "cleanup_outcome"
DEAD_LETTER_RECORD = "dead_letter"

DATABASE_SCHEMA = "lapse"
