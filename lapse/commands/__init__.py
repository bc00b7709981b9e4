"""Subcommands of `lapse`, one module per concern; every module here is imported and registers
its commands on `lapse.cli.main`."""

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
