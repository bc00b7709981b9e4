"""The files Lapse ships as package data are found through importlib.resources, and the settings'
defaults point at them (tests/system/test_wheel.py checks the same in an installed wheel)."""

from __future__ import annotations

from lapse.kernel import package_files
from lapse.kernel.codec import SchemaStore
from lapse.kernel.settings import REPO_ROOT
from lapse.kernel.topology import load_topology


def test_packaged_schemas_are_the_repositorys():
    store = SchemaStore(package_files.schemas_dir())
    assert set(store.current) == {p.stem for p in (REPO_ROOT / "schemas").glob("*.avsc")}
    assert len(store.history) == len(list((REPO_ROOT / "schemas" / "history").glob("*.avsc")))


def test_packaged_topics_file_is_the_top_level_one():
    assert package_files.topics_file().read_bytes() == (REPO_ROOT / "topics.yaml").read_bytes()
    assert load_topology(package_files.topics_file()).groups.cleanup


def test_migrations_ship_with_their_template():
    migrations = package_files.migrations_dir()
    assert (migrations / "env.py").is_file() and (migrations / "script.py.mako").is_file()
    assert list((migrations / "versions").glob("*.py"))
