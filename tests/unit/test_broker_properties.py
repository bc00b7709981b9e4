"""What the brokers started here write into server.properties: any name or value either reads back
as written, one property per line, or is refused (a newline, a backslash, a leading space, a
character Java's ISO-8859-1 reader would change)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lapse.devtools.brokers import UnsafeProperty, free_ports
from lapse.devtools.brokers.apache import properties_text

NAMES = st.text(st.sampled_from("abz.-_09=: \n\\#"), min_size=1, max_size=12)
VALUES = st.one_of(st.text(max_size=40), st.sampled_from(["/tmp/x\nsuper.users=User:ANONYMOUS", "C:\\dir\\", " x",
                                                          "a\rb", "caf\u00e9", "x\u2028y", "ok value;\"quoted\""]))


@given(properties=st.dictionaries(NAMES, VALUES, max_size=5))
def test_every_property_reads_back_as_written_or_is_refused(properties: dict[str, str]) -> None:
    try:
        text = properties_text(properties)
    except UnsafeProperty as exc:
        assert "\n" not in str(exc)
        return
    assert text.splitlines() == [f"{name}={value}" for name, value in properties.items()]
    for name, value in properties.items():
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name)  # only punctuation, as in ".", reads back too
        assert value.isascii() and value.isprintable() and "\\" not in value and not value.startswith(" ")


@pytest.mark.parametrize("value", ["/tmp/x\nsuper.users=User:ANONYMOUS", "/tmp/x\\", " /tmp/x", "/tmp/\u00e9"])
def test_a_value_that_would_change_the_file_is_refused_naming_its_property(value: str) -> None:
    with pytest.raises(UnsafeProperty, match=r"^log\.dirs = .* cannot go into a properties file"):
        properties_text({"node.id": "1", "log.dirs": value})


def test_ports_picked_together_are_distinct():
    """A broker's listener and controller ports are picked together: asked one after the other, the
    OS once handed out the same port twice and the broker refused to start."""
    ports = free_ports(64)
    assert len(set(ports)) == 64 and all(1024 <= p <= 65535 for p in ports)
