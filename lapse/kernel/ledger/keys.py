"""Operation keys and correlation ids: how one business operation is named across every room.

The op key (`<kind>:<subject_id>`) is the idempotency key: the ledger's primary key and the Kafka
key of every record about the operation.
"""

from __future__ import annotations

import re
import uuid

_KIND = r"[a-z][a-z0-9-]{0,62}"
_SUBJECT = r"[A-Za-z0-9._/-]{1,128}"
OP_KEY_RE = re.compile(rf"^(?P<kind>{_KIND}):(?P<subject>{_SUBJECT})$")


class InvalidEvent(ValueError):
    """An event no ledger row can be made for; `code` names the reason for the dead letter."""

    code = "invalid_field"


class InvalidOpKey(InvalidEvent):
    """An op key that is not `<kind>:<subject_id>`."""

    code = "malformed_op_key"


def op_key(kind: str, subject_id: str | int) -> str:
    """The idempotency key of one business operation, e.g. `release-reservation:42`."""
    key = f"{kind}:{subject_id}"
    if not OP_KEY_RE.match(key):
        raise InvalidOpKey(f"malformed op key {key[:80]!r}: expected <kind>:<subject_id>")
    return key


def parse_op_key(key: str) -> tuple[str, str]:
    match = OP_KEY_RE.match(key)
    if not match:
        raise InvalidOpKey(f"malformed op key {key[:80]!r}: expected <kind>:<subject_id>")
    return match["kind"], match["subject"]


def new_correlation_id() -> str:
    return uuid.uuid4().hex
