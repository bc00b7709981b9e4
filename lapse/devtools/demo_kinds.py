"""The demo's kinds file (`demo_kinds.yaml`, package data): release-reservation and artifact-delete
declared over the demo's tables. It is copied into the folder the demo (or a test) runs in, so
its `file:objects` store is that folder's own `objects/`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from sqlalchemy import Connection, Engine

from lapse.kernel.kinds import CleanupKind, ExternalEffect, compile_kinds, read_kinds_file
from lapse.kernel.kinds.effects import ObjectStoreEffect

KINDS_FILE = "demo_kinds.yaml"
RELEASE = "release-reservation"
ARTIFACT_DELETE = "artifact-delete"


def packaged_kinds_file() -> Path:
    """The demo kinds file inside the installed package (its objects folder would be there too:
    copy it with `write_demo_kinds` before running artifact-delete)."""
    return Path(str(resources.files("lapse.devtools").joinpath(KINDS_FILE)))


def write_demo_kinds(folder: Path) -> Path:
    """Copy the demo kinds file into `folder`; returns its path (set it as `kinds.file`)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / KINDS_FILE
    target.write_text(resources.files("lapse.devtools").joinpath(KINDS_FILE).read_text(encoding="utf-8"),
                      encoding="utf-8")
    return target


def object_folder(kinds: dict[str, CleanupKind]) -> Path:
    """The folder of artifact-delete's `file:` object store, as the kinds file resolved it."""
    effect = kinds[ARTIFACT_DELETE].external_effect
    if not isinstance(effect, ExternalEffect) or not isinstance(effect.declared, ObjectStoreEffect) \
            or not effect.declared.url.startswith("file:"):
        raise ValueError(f"{ARTIFACT_DELETE} is not declared with a file: object store")
    return Path(effect.declared.url.removeprefix("file:"))


def load_demo_kinds(bind: Engine | Connection) -> dict[str, CleanupKind]:
    """The demo's kinds compiled from the packaged file (the bench: release-reservation only, so
    the packaged folder's `objects/` is never touched)."""
    return compile_kinds(read_kinds_file(packaged_kinds_file()), bind)
