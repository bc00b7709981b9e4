"""Operation keys and correlation ids: how one business operation is named across every room.

The op key (`<kind>:<subject_id>`, or `<kind>:<subject_id>@<generation>` for a kind that declares a
generation column) is the idempotency key: the ledger's primary key and the Kafka key of every
record about the operation. Why the generation is written this way: docs/design/generations.md.
"""

from __future__ import annotations

import re
import uuid
from typing import NamedTuple

_KIND = r"[a-z][a-z0-9-]{0,62}"
_SUBJECT = r"[A-Za-z0-9._/-]{1,128}"
_GENERATION = r"[A-Za-z0-9.-]{1,32}"
# `\Z`, not `$`: `$` also matches before a final line break.
OP_KEY_RE = re.compile(rf"\A(?P<kind>{_KIND}):(?P<subject>{_SUBJECT})(?:@(?P<generation>{_GENERATION}))?\Z")
GENERATION_MARK = "@"  # between the subject id and the generation: a character no subject id holds
MAX_OP_KEY = 200  # the ledger's op_key column; a key without a generation is at most 192


class InvalidEvent(ValueError):
    """An event no ledger row can be made for; `code` names the reason for the dead letter."""

    code = "invalid_field"


class InvalidOpKey(InvalidEvent):
    """An op key that is not `<kind>:<subject_id>[@<generation>]`."""

    code = "malformed_op_key"


class OpKey(NamedTuple):
    """An op key's parts; `generation` is None for a kind without one."""

    kind: str
    subject_id: str
    generation: str | None


def _malformed(key: str) -> InvalidOpKey:
    return InvalidOpKey(f"malformed op key {key[:80]!r}: expected <kind>:<subject_id>[@<generation>] "
                        f"of at most {MAX_OP_KEY} characters")


def op_key(kind: str, subject_id: str | int, generation: str | None = None) -> str:
    """The idempotency key of one business operation, e.g. `release-reservation:42`, or
    `release-reservation:42@20261130T120000.000000Z` for the lapse of one generation of it."""
    key = f"{kind}:{subject_id}" if generation is None else f"{kind}:{subject_id}{GENERATION_MARK}{generation}"
    if len(key) > MAX_OP_KEY or not OP_KEY_RE.match(key):
        raise _malformed(key)
    return key


def op_key_parts(key: str) -> OpKey:
    """The kind, subject id and generation (None: none) of an op key; InvalidOpKey when malformed."""
    match = OP_KEY_RE.match(key) if len(key) <= MAX_OP_KEY else None
    if not match:
        raise _malformed(key)
    return OpKey(match["kind"], match["subject"], match["generation"])


def op_key_names(key: str) -> tuple[str, str]:
    """The kind and subject id an op key names (its generation aside), without making an `OpKey`:
    decoding's hot path. InvalidOpKey when malformed."""
    match = OP_KEY_RE.match(key) if len(key) <= MAX_OP_KEY else None
    if not match:
        raise _malformed(key)
    return match["kind"], match["subject"]


def parse_op_key(key: str) -> tuple[str, str]:
    """The kind and subject id of an op key (its generation aside); InvalidOpKey when malformed."""
    kind, subject, _ = op_key_parts(key)
    return kind, subject


def new_correlation_id() -> str:
    return uuid.uuid4().hex
