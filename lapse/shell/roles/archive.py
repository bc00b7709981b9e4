"""The archive role: the expiry events, outcomes, dead letters and the ledger's transitions written to
files until stopped (`lapse archive`, and `lapse run` when `archive.url` is set), or until idle
(`lapse archive --exit-when-idle`)."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from lapse.archive import (
    Archiver,
    ArchiveRefused,
    ArchiveStats,
    ArchiveStore,
    ArchiveUrlError,
    ManifestError,
    check_writable,
    open_store,
)
from lapse.kernel.settings import Settings, env_var
from lapse.shell.roles.base import StreamRole
from lapse.shell.startup_checks import StartupRefused


class ArchiveRole(StreamRole[ArchiveStats]):
    """One member of the archive group. Refused at start (exit 3) when the URL is not an archive
    URL or its store will not take a write, when topics.yaml declares no archive group, or when the
    ledger is not on PostgreSQL (the transitions are read as windows of PostgreSQL transactions)."""

    name = "archive"

    def __init__(self, settings: Settings, *, exit_when_idle: float | None = None,
                 stop: threading.Event | None = None) -> None:
        super().__init__(settings, exit_when_idle=exit_when_idle, stop=stop)
        self.store: ArchiveStore | None = None
        self.archiver: Archiver | None = None
        self.stats = ArchiveStats()

    def check(self) -> None:
        super().check()
        url = self.settings.archive.url
        if url is None:
            raise StartupRefused(f"archive.url ({env_var('archive.url')}) is not set: give s3://bucket/prefix "
                                 "or file:///folder")
        if self.settings.topology.groups.archive is None:
            raise StartupRefused(f"{self.settings.topics.file}: groups.archive is not declared: name the archive's "
                                 "consumer group there and list it under the expiry, outcomes and dlq topics' groups")
        if self.engine.dialect.name != "postgresql":
            raise StartupRefused("the archive needs the ledger on PostgreSQL: it reads the transitions as windows "
                                 "of PostgreSQL transactions")
        store = self._open(url)
        try:
            with tempfile.TemporaryDirectory(prefix="lapse-archive-probe-") as scratch:
                check_writable(store, Path(scratch))
        except ArchiveRefused as exc:
            store.close()
            raise StartupRefused(f"archive.url: {exc}") from None
        except BaseException:
            store.close()
            raise
        self.store = store

    def _open(self, url: str) -> ArchiveStore:
        try:
            return open_store(url, self.settings)
        except (ArchiveUrlError, ArchiveRefused) as exc:
            raise StartupRefused(f"archive.url ({env_var('archive.url')}): {exc}") from None

    def open(self) -> None:
        assert self.store is not None, "open after check"
        self.archiver = Archiver(self.settings, self.store, self.engine, stop=self.stop)

    def run(self) -> ArchiveStats:
        assert self.archiver is not None, "run after open"
        try:
            self.stats = self.archiver.run(exit_when_idle=self.exit_when_idle)
        except ManifestError as exc:  # the store holds an entry this archive did not write
            raise StartupRefused(f"archive.url: {exc}") from None
        return self.stats

    def close(self) -> None:
        try:
            if self.store is not None:
                self.store.close()
        finally:
            super().close()
