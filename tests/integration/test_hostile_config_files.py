"""Hostile config files against `lapse` as an operator runs it, each command a process held to 1 GiB
of address space: a 500-byte kinds file and a topics file of 4 KB of nested aliases (which once grew to
3 GB as an error quoted the expanded value), /dev/zero and a FIFO given as config files (which once
passed the size check and were read forever, or blocked the open). Each ends in one line and exit 3."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from lapse.kernel.settings import env_var
from lapse.kernel.yaml_files import MAX_EXPANDED
from lapse.shell.error_boundary import ExitCode
from tests.fixtures.processes import run_lapse
from tests.fixtures.topology import TOPICS_FILE

MEMORY_BYTES = 1 << 30
BOUND_S = 60.0


def nested_aliases(levels: int) -> str:
    node = "&a0 [" + ",".join(["lol"] * 9) + "]"
    for i in range(1, levels + 1):
        node = f"&a{i} [{node}," + ",".join([f"*a{i - 1}"] * 8) + "]"
    return node


def test_hostile_config_files_end_in_one_line_and_exit_3_within_bounded_memory(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "business.db") as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT, due TIMESTAMP)")
        db.execute("CREATE INDEX orders_due ON orders (due, id)")
    kinds_bomb = tmp_path / "kinds.yaml"
    kinds_bomb.write_text("kinds:\n  a:\n    table: orders\n    id: id\n    due: due\n    effect: {http: {url: "
                          f"'https://x/{{id}}', then_set: {{status: {nested_aliases(8)}}}}}}}\n")
    topics_bomb = tmp_path / "topics.yaml"
    topics_bomb.write_text(TOPICS_FILE.read_text().replace("    partitions: 12\n",
                                                           f"    partitions: {nested_aliases(8)}\n", 1))
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert kinds_bomb.stat().st_size < 700 and topics_bomb.stat().st_size < 4500
    env = {env_var("database.url"): f"sqlite:///{tmp_path / 'business.db'}"}
    expanded = f"larger than {MAX_EXPANDED} nodes and characters with its aliases expanded"
    cases = {
        ("kinds", "check", "--kinds-file", str(kinds_bomb)): f"lapse: {kinds_bomb}: at line 6: {expanded}",
        ("topics", "apply", "--dry-run", "--file", str(topics_bomb)): f"lapse: {topics_bomb}: at line ",
        ("kinds", "check", "--kinds-file", "/dev/zero"): "lapse: /dev/zero: the kinds file is not a regular file",
        ("topics", "apply", "--dry-run", "--file", "/dev/zero"):
            "lapse: /dev/zero: the topics file is not a regular file",
        ("kinds", "check", "--kinds-file", str(fifo)): f"lapse: {fifo}: the kinds file is not a regular file",
    }
    finished = run_lapse(*(list(args) for args in cases), env=env, cwd=tmp_path, bound_s=BOUND_S,
                         memory_bytes=MEMORY_BYTES)
    for done, start in zip(finished, cases.values(), strict=True):
        what = f"lapse {' '.join(done.args)}"
        assert (done.code, len(done.stderr)) == (ExitCode.CONFIG, 1), f"{what}: exit {done.code}, {done.stderr}"
        assert done.stderr[0].startswith(start), f"{what}: {done.stderr[0]}"
    assert finished[1].stderr[0].endswith(expanded)
