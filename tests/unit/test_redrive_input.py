"""What `lapse dlq redrive` takes from outside: DLQ positions and reason codes on its command line,
and the original bytes a poison dead letter carries (whole, clipped, or not matching their
SHA-256). No broker, no database."""

from __future__ import annotations

import hashlib

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lapse.kernel.ledger import InvalidEvent
from lapse.operator_actions import PoisonSelector
from lapse.operator_actions.poison import PoisonLetter
from lapse.operator_actions.redrive import original_value
from lapse.shell.commands.dlq_redrive import MAX_OFFSET, MAX_PARTITION, _reason_code, dlq_position


@given(st.integers(0, MAX_PARTITION), st.integers(0, MAX_OFFSET), st.sampled_from([":", "@"]))
def test_a_dlq_position_reads_back(partition, offset, sep):
    assert dlq_position(f" {partition}{sep}{offset} ") == (partition, offset)


@given(st.text(max_size=40))
def test_any_other_text_is_refused_in_one_line(text):
    try:
        partition, offset = dlq_position(text)
    except ValueError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 200
        return
    assert 0 <= partition <= MAX_PARTITION and 0 <= offset <= MAX_OFFSET


@pytest.mark.parametrize("text", ["", "0", "0:", ":1", "-1:3", "1:-3", "1.0:2", "0x1:2", "1:2:3", "\u0661:\u0662",
                                  f"{MAX_PARTITION + 1}:0", f"0:{MAX_OFFSET + 1}", "9" * 30 + ":1"])
def test_malformed_and_out_of_range_positions(text):
    with pytest.raises(ValueError):
        dlq_position(text)


@given(st.text(max_size=80))
def test_a_reason_code_is_a_short_token_or_refused(value):
    try:
        assert _reason_code(click.Context(click.Command("x")), click.Option(["--reason-code"]), value) == value
    except click.BadParameter:
        return
    assert 0 < len(value) <= 64 and value.isascii() and "\n" not in value


def letter(value: bytes | None, **headers: bytes) -> PoisonLetter:
    return PoisonLetter("lapse.dlq", 1, 7, {"failure_class": "poison", "reason": "unknown_fingerprint: x",
                                            "original_value": value}, headers)


def test_the_original_value_is_redriven_only_when_the_dead_letter_keeps_it_whole():
    value = b"\xc3\x01" + bytes(20)
    digest = hashlib.sha256(value).hexdigest().encode()
    assert original_value(letter(value, **{"lapse-original-value-sha256": digest})) == value
    assert original_value(letter(value)) == value  # a dead letter from before the digest headers
    for bad in (letter(None), letter(value, **{"lapse-original-clipped": b"key,value"}),
                letter(value[:-1], **{"lapse-original-value-sha256": digest})):
        with pytest.raises(InvalidEvent):
            original_value(bad)


def test_a_selector_takes_positions_a_reason_code_or_everything():
    poison = letter(b"x", reason=b"unknown_fingerprint")
    assert poison.reason_code == "unknown_fingerprint" and letter(b"x").reason_code == "unknown_fingerprint"
    assert PoisonSelector(offsets=((1, 7),)).matches(poison)
    assert not PoisonSelector(offsets=((1, 8), (0, 7))).matches(poison)
    assert PoisonSelector(reason_code="unknown_fingerprint").matches(poison)
    assert not PoisonSelector(reason_code="bad_magic").matches(poison)
    assert PoisonSelector(everything=True).matches(poison)
    assert PoisonSelector(offsets=((1, 7), (2, 3))).describe() == "offsets=1:7,2:3"
