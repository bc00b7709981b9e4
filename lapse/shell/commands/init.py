"""`lapse init`: a starter configuration in the current folder — lapse.toml, topics.yaml, kinds.yaml.

lapse.toml is written from the Settings model itself (every section and field with its description,
the few a user edits first set, the rest commented out), so it never names a setting that does
not exist. topics.yaml and kinds.yaml are copies of the packaged default topology and starter kinds.
Files that can hold secrets are written readable by their owner only, and no file is written
through a symbolic link.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from lapse.kernel import package_files
from lapse.kernel.settings import ENV_PREFIX, Settings, env_var
from lapse.shell.cli import main
from lapse.shell.error_boundary import CommandFailed, ExitCode

CONFIG_NAME = "lapse.toml"
TOPICS_NAME = "topics.yaml"
KINDS_NAME = "kinds.yaml"
# lapse.toml and kinds.yaml can hold secrets (a database password, an http effect's Authorization
# header): readable by their owner only. topics.yaml names topics and principals, no secret.
SECRET_MODE, PUBLIC_MODE = 0o600, 0o644

# What a new deployment edits first: written set, with these values; everything else commented out.
STARTER_VALUES: dict[str, Any] = {
    "kafka.bootstrap_servers": "127.0.0.1:9092",
    "database.url": "postgresql+psycopg://lapse@localhost:5432/lapse",
    "topics.file": TOPICS_NAME,
    "kinds.file": KINDS_NAME,
}
# Test hooks and demo fault injection: never needed by a deployment, left out of the starter file.
LEFT_OUT = {"dev"}

HEADER = f"""\
# Lapse configuration, written by `lapse init`.
# Precedence: command-line flags > {ENV_PREFIX}<SECTION>__<FIELD> variables > this file > defaults.
# A relative path here is relative to this file's folder. `lapse config show` prints what is in effect.
# Keep secrets (passwords, keys) out of this file: set them as variables, e.g. {env_var("database.url")}.
# Every section is here; uncomment a line to change that setting."""


def _toml_value(value: Any) -> str | None:
    """`value` as a TOML literal, or None when it has none worth showing (unset, or an absolute path
    of this installation such as the packaged schemas)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Path):
        return None if value.is_absolute() else json.dumps(str(value))
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return json.dumps(value)
    return None


def starter_config() -> str:
    """The text of the starter lapse.toml."""
    blocks = [HEADER]
    for section, info in Settings.model_fields.items():
        if section in LEFT_OUT:
            continue
        model: type[BaseModel] = info.annotation  # type: ignore[assignment]
        # Every table header is active, so an uncommented line lands in its own section.
        lines = [f"[{section}]  # {(model.__doc__ or '').strip().splitlines()[0]}"]
        for name, field in model.model_fields.items():
            path = f"{section}.{name}"
            lines.append(f"# {field.description}")
            if path in STARTER_VALUES:
                lines.append(f"{name} = {_toml_value(STARTER_VALUES[path])}")
                continue
            literal = _toml_value(field.get_default(call_default_factory=False))  # computed defaults: none
            lines.append(f"# {name} = {literal}" if literal is not None else f"# {name} =")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def write_file(path: Path, data: bytes, mode: int, *, replace: bool) -> None:
    """Write `path` with permissions `mode`, never through a symbolic link: the data goes to a new
    temporary file beside it, which is then linked in as `path` (failing if anything, a dangling
    link included, is there) or, with `replace`, renamed over it (replacing a link, not its target)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), mode)
            file.write(data)
        if replace:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


@main.command("init")
@click.option("--force", is_flag=True, help="Overwrite lapse.toml, topics.yaml and kinds.yaml where they exist.")
def init(force: bool) -> None:
    """Write a starter lapse.toml, topics.yaml and kinds.yaml into the current folder."""
    here = Path.cwd()
    names = (CONFIG_NAME, TOPICS_NAME, KINDS_NAME)
    link = next((here / name for name in names if (here / name).is_symlink()), None)
    if link is not None:
        raise CommandFailed(ExitCode.CONFIG, f"{link} is a symbolic link; lapse init never writes through one: "
                                             "remove it first")
    existing = [name for name in names if os.path.lexists(here / name)]
    if existing and not force:
        raise click.ClickException(f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''} "
                                   f"in {here}; --force overwrites")
    kinds_starter = package_files.starter_kinds_file()
    if not kinds_starter.is_file():
        raise click.ClickException(f"the packaged starter kinds file {kinds_starter} is missing; reinstall Lapse")
    write_file(here / CONFIG_NAME, starter_config().encode(), SECRET_MODE, replace=force)
    write_file(here / TOPICS_NAME, package_files.topics_file().read_bytes(), PUBLIC_MODE, replace=force)
    write_file(here / KINDS_NAME, kinds_starter.read_bytes(), SECRET_MODE, replace=force)
    click.echo(f"wrote {CONFIG_NAME}, {TOPICS_NAME} and {KINDS_NAME} in {here}. Next:")
    click.echo(f"  1. set kafka.bootstrap_servers and database.url in {CONFIG_NAME} "
               f"(the password in {env_var('database.url')})")
    click.echo(f"  2. declare your cleanup kinds in {KINDS_NAME}, then check them: lapse kinds check")
    click.echo("  3. create Lapse's tables and topics: lapse db upgrade && lapse topics apply")
    click.echo("  4. start the pipeline: lapse run")
