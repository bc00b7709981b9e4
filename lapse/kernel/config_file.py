"""The config file (TOML): which file a process reads, and its values as a pydantic-settings source.

The file has one table per settings section with the section's field names (`[kafka]`
`bootstrap_servers = "…"`); it sits under `LAPSE_*` variables and flags (the order lives in
`Settings.settings_customise_sources`). Which file: `--config FILE`, else `LAPSE_CONFIG`, else
`./lapse.toml` when present. A relative path in the file means a path next to the file, so a
config folder can be moved or mounted anywhere. Unknown tables and keys are refused, naming the
closest known one, so a typo never leaves a deployment on a default it meant to change.
"""

from __future__ import annotations

import difflib
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_settings import BaseSettings, TomlConfigSettingsSource

CONFIG_ENV_VAR = "LAPSE_CONFIG"
LOCAL_CONFIG_FILE = Path("lapse.toml")


class ConfigFileError(ValueError):
    """A config file that is missing, not TOML, or names a setting that does not exist (one line)."""


def choose_config_file(explicit: Path | str | None, environ: Mapping[str, str]) -> Path | None:
    """The file to read: `explicit` (`--config`), else `LAPSE_CONFIG`, else `./lapse.toml` when it
    exists, else None. A file named explicitly or by `LAPSE_CONFIG` must exist."""
    if explicit is not None:
        named = Path(explicit)
    elif environ.get(CONFIG_ENV_VAR):
        named = Path(environ[CONFIG_ENV_VAR])
    else:
        return LOCAL_CONFIG_FILE if LOCAL_CONFIG_FILE.is_file() else None
    if not named.expanduser().is_file():
        raise ConfigFileError(f"config file {named} does not exist")
    return named.expanduser()


def _sections(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    return {name: info.annotation for name, info in model.model_fields.items()}  # type: ignore[misc]


def _is_path(annotation: Any) -> bool:
    """`Path` or `Path | None`."""
    return annotation is Path or Path in typing.get_args(annotation)


def _closest(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _closest_setting(key: str, section: str | None, sections: Mapping[str, type[BaseModel]]) -> str:
    """The hint for an unknown `key`: the closest field of its own section, else of any section."""
    for candidates in ([section] if section else [], list(sections)):
        by_name = {name: f"{s}.{name}" for s in reversed(candidates) for name in sections[s].model_fields}
        close = difflib.get_close_matches(key, list(by_name), n=1, cutoff=0.6)
        if close:
            return f"; did you mean {by_name[close[0]]}?"
    return ""


def check_keys(data: Mapping[str, Any], model: type[BaseModel], file: Path) -> None:
    """Raise ConfigFileError for the first table or key that names no setting of `model`."""
    sections = _sections(model)
    for section, table in data.items():
        if section not in sections:
            hint = _closest(section, list(sections)) or _closest_setting(section, None, sections)
            raise ConfigFileError(f"{file}: unknown section {section}{hint}")
        if not isinstance(table, dict):
            raise ConfigFileError(f"{file}: {section} must be a table ([{section}]), not a value")
        for key in table:
            if key not in sections[section].model_fields:
                raise ConfigFileError(f"{file}: unknown setting {section}.{key}"
                                      f"{_closest_setting(key, section, sections)}")


def resolve_paths(data: Mapping[str, Any], model: type[BaseModel], base: Path) -> dict[str, Any]:
    """`data` with every relative value of a path field made absolute against `base`."""
    sections = _sections(model)
    resolved: dict[str, Any] = {}
    for section, table in data.items():
        fields = sections[section].model_fields
        resolved[section] = {
            key: str(base / Path(value).expanduser())
            if _is_path(fields[key].annotation) and isinstance(value, str) else value
            for key, value in table.items()
        }
    return resolved


def file_keys(data: Mapping[str, Any]) -> set[str]:
    """The dotted settings (`kafka.bootstrap_servers`) a checked file sets."""
    return {f"{section}.{key}" for section, table in data.items() for key in table}


class ConfigFileSource(TomlConfigSettingsSource):
    """pydantic-settings' TOML source with Lapse's rules: one-line errors naming the file, unknown
    keys refused, relative paths resolved against the file's folder."""

    def __init__(self, settings_cls: type[BaseSettings], toml_file: Path):
        self.file = toml_file
        self._model = settings_cls
        super().__init__(settings_cls, toml_file=toml_file)

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            data = super()._read_file(file_path)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigFileError(f"{self.file}: not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigFileError(f"{self.file}: cannot read it: {exc.strerror}") from None
        check_keys(data, self._model, self.file)
        return resolve_paths(data, self._model, Path(file_path).absolute().parent)
