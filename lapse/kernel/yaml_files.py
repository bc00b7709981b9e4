"""The one way Lapse reads a YAML file (the kinds file, topics.yaml): bounded before anything is built.

Only a regular file is read, and at most MAX_FILE_BYTES of it. Its parse events are then checked
(nesting depth, number of aliases, and the size of the document with every alias expanded) before
a single object is constructed, so a few hundred bytes of nested aliases can become neither
gigabytes in memory nor an error message that quotes them. A key given twice in one mapping is
refused rather than silently keeping the last. Every refusal is one line naming the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from lapse.kernel.text import one_line

MAX_FILE_BYTES = 1_000_000
MAX_DEPTH = 32  # collections within collections; the deepest Lapse file needs about 6
MAX_ALIASES = 1_000
# Nodes plus scalar characters, every alias expanded: a few times what a file without aliases can hold.
MAX_EXPANDED = 4 * MAX_FILE_BYTES


class YamlFileError(ValueError):
    """A YAML file that cannot be read or is not a document Lapse accepts; one line naming the file."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key given twice in one mapping (a kind or a topic declared twice
    would otherwise silently keep the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:
                continue  # unhashable: the base constructor says so
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {one_line(repr(key), 61)} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_text(path: Path, what: str) -> str:
    """The text of the regular file at `path`, read with a bound; YamlFileError when it is missing,
    not a regular file (a FIFO, a device such as /dev/zero, a folder), too big, or not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block the open
    except OSError as exc:
        raise YamlFileError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise YamlFileError(f"{path}: the {what} is not a regular file")
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise YamlFileError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise YamlFileError(f"{path}: a {what} is at most {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlFileError(f"{path}: the {what} is not UTF-8 text (byte {exc.start})") from None


def _check_events(text: str, path: Path) -> None:
    """Refuse a document nested deeper than MAX_DEPTH, with more than MAX_ALIASES aliases, with an
    alias inside its own anchor, or larger than MAX_EXPANDED once its aliases are expanded: from
    the parser's events alone, without building anything."""
    expanded = aliases = 0
    anchored: dict[str, int] = {}  # anchor → the expanded size of its node
    open_nodes: list[tuple[str | None, int]] = []  # collections being parsed: (anchor, size before)
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        where = f"{path}: at line {event.start_mark.line + 1}" if event.start_mark else str(path)
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise YamlFileError(f"{where}: more than {MAX_ALIASES} aliases")
            if any(anchor == event.anchor for anchor, _ in open_nodes):
                raise YamlFileError(f"{where}: an alias inside its own anchor")
            expanded += anchored.get(str(event.anchor), 1)
        elif isinstance(event, yaml.ScalarEvent):
            expanded += 1 + len(event.value)
            if event.anchor is not None:
                anchored[event.anchor] = 1 + len(event.value)
        elif isinstance(event, yaml.CollectionStartEvent):
            open_nodes.append((event.anchor, expanded))
            expanded += 1
            if len(open_nodes) > MAX_DEPTH:
                raise YamlFileError(f"{where}: nested more than {MAX_DEPTH} levels deep")
        elif isinstance(event, yaml.CollectionEndEvent) and open_nodes:
            anchor, before = open_nodes.pop()
            if anchor is not None:
                anchored[anchor] = expanded - before
        if expanded > MAX_EXPANDED:
            raise YamlFileError(f"{where}: larger than {MAX_EXPANDED} nodes and characters with its "
                                "aliases expanded")


def load_text(text: str, path: Path) -> Any:
    """The document of `text` (from the file at `path`, which errors name), checked by
    `_check_events` first; YamlFileError (one line) when it is not valid or not acceptable YAML."""
    try:
        _check_events(text, path)
        loader = _UniqueKeyLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlFileError(f"{path}: not valid YAML{where}: {one_line(str(problem), 200)}") from None


def load_file(path: Path, what: str) -> Any:
    """The document of the YAML file at `path` (`what` names it in errors: "kinds file")."""
    return load_text(read_text(path, what), path)
