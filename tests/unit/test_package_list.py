"""Every Python package of the house is listed in pyproject.toml's `packages`, so the wheel carries
it (a package missing there installs as a broken import, which only the wheel's system test would
show, minutes later)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_with_an_init_is_in_the_wheels_package_list():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for name, folder in config["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            if "__pycache__" in init.parts or any(part.startswith(".") for part in init.relative_to(ROOT).parts):
                continue
            relative = init.parent.relative_to(base).parts
            if name == "lapse" and relative[:1] and (ROOT / "lapse" / relative[0]).is_symlink():
                continue  # a room's symlink (lapse/processors → processors): listed under its own name
            found.add(".".join((name, *relative)))
    assert found - listed == set(), "packages the wheel would leave out"
