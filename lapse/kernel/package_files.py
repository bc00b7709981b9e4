"""Files that ship inside the installed `lapse` package: the Avro schemas, the default topics.yaml,
the Alembic migrations and the starter kinds file.

They are found with `importlib.resources`, so they are the same files whether Lapse runs from the
repository or from a wheel in any environment and working folder. In the repository, `lapse/schemas`
and `lapse/topics.yaml` are symlinks to the top-level `schemas/` and `topics.yaml` (the one source);
the wheel holds copies (see `[tool.setuptools.package-data]` in pyproject.toml).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def packaged(*parts: str) -> Path:
    """The real path of a file or folder shipped under the `lapse` package (`packaged("topics.yaml")`).
    Lapse is installed as files, not zipped: Alembic reads its migrations folder, and settings keep
    plain paths. Anchored at `lapse` so finding a file imports no subpackage."""
    resource = files("lapse").joinpath(*parts)
    if not isinstance(resource, Path):
        raise RuntimeError(f"lapse/{'/'.join(parts)} is not a file on disk; install Lapse unzipped")
    return resource


def schemas_dir() -> Path:
    """The packaged Avro schemas (`*.avsc`, and `history/` for older writers)."""
    return packaged("schemas")


def topics_file() -> Path:
    """The packaged default topics.yaml."""
    return packaged("topics.yaml")


def migrations_dir() -> Path:
    """The Alembic migrations (env.py, script.py.mako, versions/)."""
    return packaged("kernel", "migrations")


def starter_kinds_file() -> Path:
    """The kinds file `lapse init` copies: a commented example declaration."""
    return packaged("kernel", "kinds", "starter.yaml")
