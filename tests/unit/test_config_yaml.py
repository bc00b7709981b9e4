"""Every YAML file Lapse reads (the kinds file, topics.yaml) goes through one bounded loader: a file
that is not a regular file, too big, nested too deep, with too many aliases or too large once its
aliases are expanded is refused in one line before anything is built from it, and the expanded
size it counts is exact."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from lapse.kernel import yaml_files
from lapse.kernel.kinds import KindsFileError, read_kinds_file
from lapse.kernel.topology import TopicsFileError, load_topology
from lapse.kernel.yaml_files import MAX_ALIASES, MAX_DEPTH, MAX_FILE_BYTES, YamlFileError, load_text
from lapse.shell.app import main
from tests.fixtures.topology import TOPICS_FILE


def nested_aliases(levels: int) -> str:
    """A flow list of nine strings, each level nine aliases of the one below, anchored in place:
    a few hundred bytes that expand to 9**(levels + 1) strings."""
    node = "&a0 [" + ",".join(["lol"] * 9) + "]"
    for i in range(1, levels + 1):
        node = f"&a{i} [{node}," + ",".join([f"*a{i - 1}"] * 8) + "]"
    return node


# The reviewer's two files, in the places where an error quoted the value: a kinds file whose
# then_set value (shown by the "does not fit" error) and a topics file whose config value expand to
# 43 million strings.
KINDS_BOMB = ("kinds:\n  a:\n    table: orders\n    id: id\n    due: due\n"
              f"    effect: {{http: {{url: 'https://x/{{id}}', then_set: {{status: {nested_aliases(7)}}}}}}}\n")
TOPICS_BOMB = TOPICS_FILE.read_text().replace(
    "    partitions: 12\n", f"    partitions: 12\n    config: {{x: {nested_aliases(7)}}}\n", 1)


def test_the_bombs_are_small_and_expand_past_every_limit() -> None:
    assert len(KINDS_BOMB) < 700 and "config: {x: &a7" in TOPICS_BOMB
    assert 9 ** 8 * len("lol") > 10 * yaml_files.MAX_EXPANDED


def test_an_alias_bomb_in_the_kinds_file_is_refused_in_one_line_before_anything_is_built(tmp_path: Path) -> None:
    path = tmp_path / "kinds.yaml"
    path.write_text(KINDS_BOMB)
    with pytest.raises(KindsFileError) as caught:
        read_kinds_file(path)
    assert str(caught.value) == (f"{path}: at line 6: larger than {yaml_files.MAX_EXPANDED} nodes and characters "
                                 "with its aliases expanded")


def test_an_alias_bomb_in_the_topics_file_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "topics.yaml"
    path.write_text(TOPICS_BOMB)
    with pytest.raises(TopicsFileError, match=r"larger than \d+ nodes and characters with its aliases expanded$"):
        load_topology(path)
    result = CliRunner().invoke(main, ["topics", "apply", "--file", str(path), "--dry-run"])
    assert result.exit_code == 3
    assert result.output.count("\n") == 1 and "aliases expanded" in result.output


def _aliases(count: int) -> str:
    return "a: &x [1]\nb: [" + ", ".join(["*x"] * count) + "]\n"


@pytest.mark.parametrize(("text", "expected"), [
    (_aliases(MAX_ALIASES), None),
    (_aliases(MAX_ALIASES + 1), f"more than {MAX_ALIASES} aliases"),
    ("a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1), None),  # the top mapping is the first level
    ("a: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH, f"nested more than {MAX_DEPTH} levels deep"),
    ("a: &x [1, *x]", "an alias inside its own anchor"),
    ("a: 1\na: 2", "not valid YAML at line 2: key 'a' given twice"),
    ("a: !!python/object:os.system {}", "not valid YAML at line 1: could not determine a constructor"),
    ("a: *nowhere", "not valid YAML at line 1: found undefined alias 'nowhere'"),
])
def test_what_the_loader_refuses(text: str, expected: str | None) -> None:
    if expected is None:
        load_text(text, Path("f.yaml"))
        return
    with pytest.raises(YamlFileError) as caught:
        load_text(text, Path("f.yaml"))
    assert str(caught.value).startswith("f.yaml: ") and expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_topics_file_naming_a_topic_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "topics.yaml"
    text = TOPICS_FILE.read_text()
    path.write_text(text.replace("topics:\n", "topics:\n  lapse.expiry: {partitions: 1}\n", 1))
    with pytest.raises(TopicsFileError, match=r"key 'lapse\.expiry' given twice"):
        load_topology(path)


@pytest.mark.parametrize("which", ["folder", "too big", "not utf-8", "missing"])
def test_only_a_regular_utf8_file_of_bounded_size_is_read(tmp_path: Path, which: str) -> None:
    path = tmp_path / "kinds.yaml"
    expected = {"folder": "the kinds file is not a regular file",
                "too big": f"a kinds file is at most {MAX_FILE_BYTES} bytes",
                "not utf-8": "the kinds file is not UTF-8 text (byte 7)",
                "missing": "cannot read the kinds file (No such file or directory)"}[which]
    if which == "folder":
        path.mkdir()
    elif which == "too big":
        path.write_text("kinds: {}\n" + "#" * MAX_FILE_BYTES)
    elif which == "not utf-8":
        path.write_bytes(b"kinds: \xff")
    with pytest.raises(KindsFileError) as caught:
        read_kinds_file(path)
    assert str(caught.value) == f"{path}: {expected}"


# --- the expanded size is counted exactly ---------------------------------------------------------

WORDS = st.text(string.ascii_lowercase, min_size=1, max_size=6)
TREES = st.recursive(WORDS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(WORDS, inner, max_size=3),
                     max_leaves=12)


def expanded_size(value: Any) -> int:
    """Nodes plus scalar characters of `value` with every shared part counted where it appears."""
    if isinstance(value, dict):
        return 1 + sum(expanded_size(k) + expanded_size(v) for k, v in value.items())
    if isinstance(value, list):
        return 1 + sum(expanded_size(v) for v in value)
    return 1 + len(value)


@given(shared=TREES.filter(lambda t: isinstance(t, (list, dict))), copies=st.integers(1, 5), other=TREES)
def test_the_expanded_size_is_exact_and_the_limit_holds_at_it(shared: Any, copies: int, other: Any) -> None:
    document = {"shared": [shared] * copies, "nested": [[shared], {"again": shared}], "other": other}
    text = yaml.safe_dump(document)
    assert copies == 1 or "*id" in text  # the shared part is written once, then aliased
    size = expanded_size(document)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(yaml_files, "MAX_EXPANDED", size)
        assert load_text(text, Path("f.yaml")) == document
        patch.setattr(yaml_files, "MAX_EXPANDED", size - 1)
        with pytest.raises(YamlFileError, match="with its aliases expanded"):
            load_text(text, Path("f.yaml"))
