"""The root `lapse` command group. Commands attach themselves to it from `lapse.shell.commands`
(and from installed `lapse.commands` entry points); `lapse.shell.app` assembles them."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def main() -> None:
    """Lapse: idempotent cleanup of things that lapse, driven by Kafka."""
