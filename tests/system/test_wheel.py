"""The wheel installs one top-level package, `lapse`: built from this checkout (offline, with this
environment's setuptools), installed without dependencies into a fresh virtual environment that
does not see the system's site-packages, and inspected there. Its package data (schemas,
topics.yaml, migrations, the starter kinds file) is found from an empty folder outside the
repository: `lapse --version`, `lapse init`, `lapse config show` and the topology and schemas load.

The build runs on a copy of the sources, so it leaves nothing (build/, *.egg-info) in the checkout.
"""

from __future__ import annotations

import email
import glob
import json
import os
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.wheel import PACKAGE_DIRS, PYPROJECT, REPO, check_ok, run_clean

pytestmark = pytest.mark.slow

PACKAGE_DATA: dict[str, list[str]] = PYPROJECT["tool"]["setuptools"]["package-data"]
MUST_SHIP = ("lapse/py.typed", "lapse/processors/rules.py", "lapse/readers/audit.py",
             "lapse/kernel/migrations/env.py", "lapse/kernel/migrations/script.py.mako",
             "lapse/topics.yaml", "lapse/schemas/expiry_event.avsc", "lapse/schemas/history/expiry_event.v1.avsc",
             "lapse/kernel/kinds/starter.yaml")
REPO_ONLY_NAMES = ("processors", "producers", "reconciler", "readers", "retention", "reports", "operator_actions",
                   "archive")
SECRET = "s3cr3t-never-shown-Zq81"


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


def _package_source(package: str) -> Path:
    """The repository folder of an installed package name, through the package-dir mapping."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        if (mapped := PACKAGE_DIRS.get(".".join(parts[:n]))) is not None:
            return REPO / mapped / Path(*parts[n:])
    return REPO / Path(*parts)


def _declared_data_files() -> set[str]:
    """Every file in the checkout that `[tool.setuptools.package-data]` declares, by installed path."""
    found = set()
    for package, patterns in PACKAGE_DATA.items():
        root = _package_source(package)
        for pattern in patterns:
            for path in glob.glob(str(root / pattern)):
                found.add(str(Path(*package.split(".")) / Path(path).relative_to(root)))
    return found


def test_the_build_prints_no_warning_and_the_metadata_says_what_a_registry_shows(
        built_wheel: tuple[Path, str]) -> None:
    wheel, output = built_wheel
    warnings = [line for line in output.splitlines() if "warning" in line.lower()]
    assert warnings == []
    with zipfile.ZipFile(wheel) as archive:
        info = f"lapse-{PYPROJECT['project']['version']}.dist-info"
        metadata = email.message_from_bytes(archive.read(f"{info}/METADATA"))
        assert archive.read(f"{info}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["Requires-Python"] == ">=3.11"
    classifiers = metadata.get_all("Classifier")
    assert {"Programming Language :: Python :: 3.11", "Typing :: Typed"} <= set(classifiers)
    assert not any(c.startswith("License ::") for c in classifiers)  # the SPDX expression says it
    assert set(metadata.get_all("Provides-Extra")) >= {"s3", "console", "analytics", "embedded", "bench"}
    assert not any(r.startswith("faust") for r in metadata.get_all("Requires-Dist") if "extra ==" not in r)


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
    declared = _declared_data_files()
    assert set(MUST_SHIP) - {"lapse/processors/rules.py", "lapse/readers/audit.py"} <= declared
    # Real files, not links back into a checkout.
    missing = sorted(f for f in {*MUST_SHIP, *declared} if not (site / f).is_file() or (site / f).is_symlink())
    assert missing == []
    assert (site / "lapse/topics.yaml").read_bytes() == (REPO / "topics.yaml").read_bytes()
    packages = _source_packages()
    assert {"lapse", "lapse.kernel", "lapse.processors", "lapse.readers"} <= packages
    not_shipped = sorted(p for p in packages if not (site / p.replace(".", "/") / "__init__.py").is_file())
    assert not_shipped == [], "add them to [tool.setuptools] packages in pyproject.toml"


def test_rooms_import_only_under_lapse(installed: tuple[Path, Path, set[str]], tmp_path: Path) -> None:
    python, site, _ = installed
    # -I: no PYTHON* variables, no user site, and neither the cwd nor the script's folder on sys.path.
    for name in REPO_ONLY_NAMES:
        result = run_clean(python, "-I", "-c", f"import {name}", cwd=tmp_path)
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, (name, result.stderr)
    # lapse/__init__ has no dependencies, so the room's spec resolves without installing any.
    origin = check_ok(run_clean(python, "-I", "-c", "import importlib.util as u; "
                         "print(u.find_spec('lapse.processors').origin)", cwd=tmp_path))
    assert Path(origin).resolve() == (site / "lapse" / "processors" / "__init__.py").resolve()


def test_the_installed_command_finds_its_package_data_anywhere(
        installed: tuple[Path, Path, set[str]], lapse_cli: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    python, site, _ = installed
    work = tmp_path_factory.mktemp("empty-folder")
    assert REPO not in work.parents and list(work.iterdir()) == []

    dist_version = check_ok(run_clean(python, "-I", "-c", "import importlib.metadata as m; print(m.version('lapse'))",
                               cwd=work))
    assert check_ok(run_clean(lapse_cli, "--version", cwd=work)) == f"lapse {dist_version}"

    # Defaults are the packaged files of this installation, and they load.
    probe = ("import json, lapse\n"
             "from lapse.kernel.codec import SchemaStore\n"
             "from lapse.kernel.package_files import migrations_dir\n"
             "from lapse.kernel.settings import load_settings\n"
             "s = load_settings()\n"
             "print(json.dumps({'lapse': lapse.__file__, 'schemas': str(s.schemas.dir),\n"
             "  'topics': str(s.topics.file), 'current': sorted(SchemaStore(s.schemas.dir).current),\n"
             "  'cleanup_group': s.topology.groups.cleanup,\n"
             "  'mako': (migrations_dir() / 'script.py.mako').is_file()}))\n")
    found = json.loads(check_ok(run_clean(python, "-I", "-c", probe, cwd=work)))
    assert Path(found["lapse"]).parent == site / "lapse"
    assert Path(found["schemas"]) == site / "lapse" / "schemas"
    assert Path(found["topics"]) == site / "lapse" / "topics.yaml"
    assert found["current"] == sorted(p.stem for p in (REPO / "schemas").glob("*.avsc"))
    assert found["cleanup_group"] and found["mako"] is True

    # `lapse init` writes the starter; `lapse config show` reads it, secrets masked.
    init = check_ok(run_clean(lapse_cli, "init", cwd=work))
    assert sorted(p.name for p in work.iterdir()) == ["kinds.yaml", "lapse.toml", "topics.yaml"]
    assert (work / "topics.yaml").read_bytes() == (site / "lapse" / "topics.yaml").read_bytes()
    assert "lapse db upgrade" in init
    shown = json.loads(check_ok(run_clean(lapse_cli, "config", "show", "--json", cwd=work,
                                   LAPSE_KAFKA__SASL_PASSWORD=SECRET)))
    assert shown["config_file"] == "lapse.toml"
    settings = shown["settings"]
    assert settings["topics"]["file"] == {"value": str(work / "topics.yaml"), "origin": "file lapse.toml"}
    assert settings["kinds"]["file"] == {"value": str(work / "kinds.yaml"), "origin": "file lapse.toml"}
    assert settings["schemas"]["dir"] == {"value": str(site / "lapse" / "schemas"), "origin": "default"}
    assert settings["kafka"]["sasl_password"] == {"value": "********", "origin": "env LAPSE_KAFKA__SASL_PASSWORD"}
    text = check_ok(run_clean(lapse_cli, "config", "show", cwd=work, LAPSE_KAFKA__SASL_PASSWORD=SECRET))
    assert SECRET not in text and "kafka.sasl_password" in text

    # `lapse topics apply --dry-run` reads topics.yaml before it needs a broker: with none listening
    # it gets as far as Kafka (a missing or broken topics file would stop it first, naming the file).
    dry_run = run_clean(lapse_cli, "topics", "apply", "--dry-run", "--bootstrap-servers", "127.0.0.1:9", cwd=work)
    assert dry_run.returncode == 4 and "kafka at 127.0.0.1:9 unreachable" in dry_run.stderr, dry_run.stderr
    (work / "topics.yaml").write_text("topics: {}\n")
    broken = run_clean(lapse_cli, "topics", "apply", "--dry-run", "--bootstrap-servers", "127.0.0.1:9", cwd=work)
    assert broken.returncode == 3 and "topics.yaml" in broken.stderr and "kafka" not in broken.stderr.lower()
