"""`lapse config show`: every effective setting, where its value came from, secrets masked.

The answer to "which database is this process pointed at, and why": flags over `LAPSE_*` over the
config file over defaults, as `load_settings` applies them.
"""

from __future__ import annotations

import json
from typing import Any

import click

from lapse.kernel.config_file import ConfigFileError
from lapse.kernel.settings import config_file_in_use, nest, setting_origins
from lapse.shell.cli import config_file_option, main
from lapse.shell.cli_options import build_settings, connection_options, emit
from lapse.shell.masking import masked_settings


@main.group("config")
def config() -> None:
    """The effective configuration (flags, LAPSE_* variables, config file, defaults)."""


def _value_text(value: Any) -> str:
    if value is None:
        return "-"
    return value if isinstance(value, str) and value else json.dumps(value, sort_keys=True)


def _text(result: dict[str, Any]) -> str:
    """One line per setting (`kafka.bootstrap_servers  kafka-1:9092  (env LAPSE_…)`), a blank line
    between sections."""
    lines = [f"config file: {result['config_file'] or 'none (no --config, LAPSE_CONFIG or ./lapse.toml)'}"]
    for section, fields in result["settings"].items():
        rows = [(f"{section}.{name}", _value_text(shown["value"]), shown["origin"]) for name, shown in fields.items()]
        name_width = max(len(row[0]) for row in rows)
        value_width = min(max(len(row[1]) for row in rows), 40)
        lines.append("")
        lines.extend(f"{name:<{name_width}}  {value:<{value_width}}  ({origin})" for name, value, origin in rows)
    return "\n".join(lines)


@config.command("show")
@connection_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def config_show(as_json: bool, **flags: Any) -> None:
    """Print every effective setting, one line each by section, with where it came from
    (default, file F, env LAPSE_X__Y, flag); secrets masked."""
    dotted = {name.replace("__", "."): value for name, value in flags.items()}
    settings = build_settings(dotted)
    config_file = config_file_option()
    try:
        chosen = config_file_in_use(config_file)
        origins = setting_origins(config_file, **nest(dotted))
    except ConfigFileError as exc:
        raise click.UsageError(str(exc)) from None
    result = {
        "config_file": str(chosen) if chosen is not None else None,
        "settings": {
            section: {name: {"value": value, "origin": origins[f"{section}.{name}"]}
                      for name, value in fields.items()}
            for section, fields in masked_settings(settings).items()
        },
    }
    emit(result, as_json, _text)
