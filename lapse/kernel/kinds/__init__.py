"""Cleanup kinds: what makes a business row eligible, how its op key is built, and its effect.

A kind is plain data plus functions over a database connection, so the sweep, the processors and
the reconciler all use the same definition. Register more kinds with `register()` or by dotted path
(`module:attribute`) in `LAPSE_PROCESSOR__EXTRA_KINDS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    Connection,
    Select,
    Table,
    select,
    tuple_,
    update,
)

from lapse.kernel.batch_sql import any_of
from lapse.kernel.ledger import has_ledger_row, op_key
from lapse.kernel.models import artifacts, reservations


@dataclass(frozen=True, slots=True)
class EligibleRow:
    """A business row whose cleanup is due."""

    subject_id: str
    tenant: str
    due_at: datetime
    cursor: tuple[Any, ...]


@dataclass(frozen=True)
class ExternalEffect:
    """An effect outside the database, run under a lease. `targets` reads, for the subjects still
    eligible, what to act on (subject_id → target, e.g. an object key); `action` names what the
    processor does with each target ("delete-object"); `complete` records the done effect on the
    business rows in the completion transaction and returns the subject ids it changed."""

    action: str
    targets: Callable[[Connection, list[Any], datetime], dict[str, str]]
    complete: Callable[[Connection, list[Any], datetime], set[str]]


@dataclass(frozen=True)
class CleanupKind:
    """One kind of cleanup. `apply_in_db` runs inside the claim transaction and returns the subject
    ids it changed (the rest are skipped: someone else won the race). Kinds whose effect lives
    outside the database set `external_effect` instead (run under a lease)."""

    name: str
    table: Table
    id_column: Column[Any]
    tenant_column: Column[Any]
    due_column: Column[Any]
    still_eligible: ColumnElement[bool]  # the business condition, without the due time
    parse_subject: Callable[[str], Any]
    apply_in_db: Callable[[Connection, list[Any], datetime], set[str]] | None = None
    external_effect: ExternalEffect | None = None
    max_attempts: int = 6
    retry_base_s: float = 5.0
    retry_cap_s: float = 3600.0
    idempotent_effect: bool = True
    effect_rate_per_s: float = 100.0  # token-bucket rate of external effects, per worker

    def op_key(self, subject_id: Any) -> str:
        return op_key(self.name, subject_id)

    def eligible_page(
        self, now: datetime, after: tuple[Any, ...] | None, limit: int, *, without_ledger: bool
    ) -> Select[Any, Any, Any]:
        """Due rows in keyset order (due time, id) after `after`; optionally only those with no
        ledger row yet (the sweep), or all of them (the reconciler's anomaly checks)."""
        cols = (self.due_column, self.id_column)
        stmt = select(self.id_column, self.tenant_column, self.due_column).where(
            self.still_eligible, self.due_column <= now
        )
        if after is not None:
            stmt = stmt.where(tuple_(*cols) > tuple_(*after))
        if without_ledger:
            stmt = stmt.where(~has_ledger_row(self.name, self.id_column))
        return stmt.order_by(*cols).limit(limit)

    def not_yet_due(self, conn: Connection, subjects: list[Any], now: datetime) -> dict[str, datetime]:
        """Subjects still eligible whose due time is now in the future (a hold was extended after
        its event was produced): subject id → the new due time."""
        stmt = select(self.id_column, self.due_column).where(
            self.id_column.in_(subjects), self.still_eligible, self.due_column > now)
        return {str(subject): due for subject, due in conn.execute(stmt)}

    def to_eligible(self, row: Sequence[Any]) -> EligibleRow:
        subject, tenant, due = row
        return EligibleRow(str(subject), tenant, due, (due, subject))


MAX_BIGINT = 2**63 - 1


def _parse_int_id(subject_id: str) -> int:
    if not subject_id.isdigit() or int(subject_id) > MAX_BIGINT:
        raise ValueError(f"subject id {subject_id[:40]!r} is not a numeric id (1 to 2**63-1)")
    return int(subject_id)


def release_reservations(conn: Connection, ids: list[int], now: datetime) -> set[str]:
    """The conditional business effect: only a reservation still held and past its expiry is
    released; a payment or cancellation that won the race leaves the row alone."""
    if not ids:
        return set()
    stmt = (
        update(reservations)
        .where(
            any_of(conn, reservations.c.id, ids, BigInteger()),
            reservations.c.status == "held",
            reservations.c.expires_at <= now,
        )
        .values(status="released", released_at=now)
        .returning(reservations.c.id)
    )
    return {str(i) for i in conn.execute(stmt).scalars()}


RELEASE_RESERVATION = CleanupKind(
    name="release-reservation",
    table=reservations,
    id_column=reservations.c.id,
    tenant_column=reservations.c.tenant,
    due_column=reservations.c.expires_at,
    still_eligible=reservations.c.status == "held",
    parse_subject=_parse_int_id,
    apply_in_db=release_reservations,
)

def artifact_targets(conn: Connection, ids: list[int], now: datetime) -> dict[str, str]:
    """Object keys of the artifacts still live and past their retention."""
    if not ids:
        return {}
    stmt = select(artifacts.c.id, artifacts.c.object_key).where(
        artifacts.c.id.in_(ids), artifacts.c.status == "live", artifacts.c.retain_until <= now)
    return {str(i): key for i, key in conn.execute(stmt)}


def mark_artifacts_deleted(conn: Connection, ids: list[int], now: datetime) -> set[str]:
    """Record the deletion on the artifacts still live; returns the ids it changed."""
    if not ids:
        return set()
    stmt = (
        update(artifacts)
        .where(artifacts.c.id.in_(ids), artifacts.c.status == "live")
        .values(status="deleted", deleted_at=now)
        .returning(artifacts.c.id)
    )
    return {str(i) for i in conn.execute(stmt).scalars()}


ARTIFACT_DELETE = CleanupKind(
    name="artifact-delete",
    table=artifacts,
    id_column=artifacts.c.id,
    tenant_column=artifacts.c.tenant,
    due_column=artifacts.c.retain_until,
    still_eligible=artifacts.c.status == "live",
    parse_subject=_parse_int_id,
    external_effect=ExternalEffect("delete-object", artifact_targets, mark_artifacts_deleted),
    max_attempts=5,
    retry_base_s=2.0,
    retry_cap_s=600.0,
    idempotent_effect=True,  # delete-if-present
    effect_rate_per_s=200.0,
)

BUILT_IN = (RELEASE_RESERVATION, ARTIFACT_DELETE)

_REGISTRY: dict[str, CleanupKind] = {}


def register(kind: CleanupKind) -> CleanupKind:
    _REGISTRY[kind.name] = kind
    return kind


def load_kind(dotted: str) -> CleanupKind:
    """Import a kind named as `package.module:ATTRIBUTE`; a clear error when it is not one."""
    module_name, _, attr = dotted.partition(":")
    try:
        kind = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"cannot load cleanup kind {dotted!r}: {exc}") from None
    if not isinstance(kind, CleanupKind):
        raise ValueError(f"{dotted!r} is not a CleanupKind")
    return kind


def registry(extra: Iterable[str] = ()) -> dict[str, CleanupKind]:
    """Every known kind by name: the built-ins, those registered in code, and `extra` dotted paths."""
    kinds = {**{kind.name: kind for kind in BUILT_IN}, **_REGISTRY}
    for dotted in extra:
        kind = load_kind(dotted)
        kinds[kind.name] = kind
    return kinds
