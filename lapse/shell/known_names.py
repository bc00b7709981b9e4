"""Kinds and tenants given to a command are names it must know: one no operation has and no
declaration names is refused in one line (exit 2), not answered with an empty result."""

from __future__ import annotations

import difflib

from sqlalchemy import Connection

from lapse.kernel.kinds import KindsFileError, declared_names
from lapse.kernel.ledger import FIELD_LIMITS, FORBIDDEN_CHARACTERS, InvalidOpKey, op_key
from lapse.kernel.settings import Settings
from lapse.kernel.text import one_line
from lapse.readers import known_kind, known_tenant
from lapse.shell.error_boundary import CommandFailed, ExitCode

SHOWN_CHARS = 64


def _declared(settings: Settings) -> frozenset[str]:
    """The kinds the kinds file declares; none when there is no (readable) kinds file."""
    try:
        return declared_names(settings.kinds.file)
    except KindsFileError:
        return frozenset()


def _storable_kind(kind: str) -> bool:
    try:
        op_key(kind, "0")
    except InvalidOpKey:
        return False
    return True


def _storable_tenant(tenant: str) -> bool:
    return 0 < len(tenant) <= FIELD_LIMITS["tenant"] and not FORBIDDEN_CHARACTERS.search(tenant)


def refuse_unknown(conn: Connection, settings: Settings, *, kind: str | None = None,
                   tenant: str | None = None) -> None:
    """CommandFailed (usage, exit 2) for a kind neither declared nor in the ledger, or a tenant no
    operation in the ledger has; one index probe each, and none for a name no ledger row could hold."""
    if kind is not None:
        declared = _declared(settings)
        if kind not in declared and not (_storable_kind(kind) and known_kind(conn, kind)):
            close = difflib.get_close_matches(kind, sorted(declared), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else (
                f"; the kinds file declares {', '.join(sorted(declared)[:10])}" if declared else "")
            raise CommandFailed(ExitCode.USAGE, f"unknown kind '{one_line(kind, SHOWN_CHARS, escape=True)}': "
                                                f"no operation has it and no declaration names it{hint}")
    if tenant is not None and not (_storable_tenant(tenant) and known_tenant(conn, tenant)):
        raise CommandFailed(ExitCode.USAGE, f"unknown tenant '{one_line(tenant, SHOWN_CHARS, escape=True)}': "
                                            "no operation has it")
