"""The wheel installs one top-level package, `lapse`: built from this checkout (offline, with this
environment's setuptools), installed without dependencies into a fresh virtual environment that
does not see the system's site-packages, and inspected there.

The build runs on a copy of the sources, so it leaves nothing (build/, *.egg-info) in the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Installed package name → its folder in the repository (the rooms live at the top level).
PACKAGE_DIRS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
MUST_SHIP = ("lapse/py.typed", "lapse/processors/rules.py", "lapse/readers/audit.py",
             "lapse/kernel/migrations/env.py", "lapse/kernel/migrations/versions/0001_initial.py")
REPO_ONLY_NAMES = ("processors", "producers", "reconciler", "readers")


def _run(*cmd: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def _check(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args}:\n{result.stdout}\n{result.stderr}"
    return result.stdout.strip()


def _source_packages() -> set[str]:
    """Every package (a folder with __init__.py) under the package-dir folders, by installed name.
    Symlinks are not followed: lapse/processors and the like are the rooms' own entries."""
    found = set()
    for name, folder in PACKAGE_DIRS.items():
        root = REPO / folder
        for here, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not (Path(here) / d).is_symlink()]
            if "__init__.py" in files:
                rel = Path(here).relative_to(root).parts
                found.add(".".join((name, *rel)))
    return found


def _copy_sources(dest: Path) -> None:
    """What the build reads: pyproject.toml, the readme and the package folders (symlinks kept)."""
    dest.mkdir()
    shutil.copy2(REPO / "pyproject.toml", dest)
    shutil.copy2(REPO / PYPROJECT["project"]["readme"], dest)
    for folder in sorted({f.split("/")[0] for f in PACKAGE_DIRS.values()}):
        shutil.copytree(REPO / folder, dest / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, set[str]]:
    """(the fresh environment's python, its site-packages, the entries the wheel added there)."""
    tmp = tmp_path_factory.mktemp("wheel")
    _copy_sources(tmp / "src")
    _check(_run(sys.executable, "-m", "pip", "wheel", tmp / "src", "--no-deps", "--no-build-isolation",
                "--no-index", "-w", tmp / "dist", cwd=tmp))
    wheels = list((tmp / "dist").glob("lapse-*.whl"))
    assert len(wheels) == 1, wheels

    venv.create(tmp / "env", with_pip=True, system_site_packages=False, clear=True)
    python = tmp / "env" / "bin" / "python"
    site = Path(_check(_run(python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                            cwd=tmp)))
    before = {p.name for p in site.iterdir()}
    _check(_run(python, "-m", "pip", "install", "--no-deps", "--no-index", wheels[0], cwd=tmp))
    added = {p.name for p in site.iterdir()} - before
    return python, site, added


def test_one_top_level_package(installed: tuple[Path, Path, set[str]]) -> None:
    _, site, added = installed
    dist_infos = [name for name in added if name.endswith(".dist-info")]
    assert len(dist_infos) == 1 and dist_infos[0].startswith("lapse-"), added
    assert added == {"lapse", dist_infos[0]}
    top_level = (site / dist_infos[0] / "top_level.txt").read_text().split()
    assert set(top_level) == {"lapse"}
    # Nothing else in site-packages either: every installed file is under lapse/, the metadata,
    # or the console script (outside site-packages).
    record = (site / dist_infos[0] / "RECORD").read_text().splitlines()
    outside = [line for line in record
               if not line.startswith(("lapse/", f"{dist_infos[0]}/", "../"))]
    assert outside == []


def test_the_wheel_holds_every_package_and_data_file(installed: tuple[Path, Path, set[str]]) -> None:
    _, site, _ = installed
    missing = [f for f in MUST_SHIP if not (site / f).is_file()]
    assert missing == []
    packages = _source_packages()
    assert {"lapse", "lapse.kernel", "lapse.processors", "lapse.readers"} <= packages
    not_shipped = sorted(p for p in packages if not (site / p.replace(".", "/") / "__init__.py").is_file())
    assert not_shipped == [], "add them to [tool.setuptools] packages in pyproject.toml"


def test_rooms_import_only_under_lapse(installed: tuple[Path, Path, set[str]], tmp_path: Path) -> None:
    python, site, _ = installed
    # -I: no PYTHON* variables, no user site, and neither the cwd nor the script's folder on sys.path.
    for name in REPO_ONLY_NAMES:
        result = _run(python, "-I", "-c", f"import {name}", cwd=tmp_path)
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, (name, result.stderr)
    # lapse/__init__ has no dependencies, so the room's spec resolves without installing any.
    origin = _check(_run(python, "-I", "-c", "import importlib.util as u; "
                         "print(u.find_spec('lapse.processors').origin)", cwd=tmp_path))
    assert Path(origin).resolve() == (site / "lapse" / "processors" / "__init__.py").resolve()
