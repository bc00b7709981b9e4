"""The relay's slot arithmetic: the bit mask a relay filters its rows by, and its fair share."""

from lapse.producers.relay_queries import SLOTS, slot_mask
from lapse.producers.relay_slots import fair_share


def test_the_slot_mask_is_a_signed_64_bit_integer_with_one_bit_per_slot():
    assert slot_mask([0, 1]) == 3
    assert slot_mask([SLOTS - 1]) == -(1 << 63)  # the top slot is the sign bit: still a bigint
    assert slot_mask(range(SLOTS)) == -1
    assert slot_mask([]) == 0
    assert all(-(1 << 63) <= slot_mask([s]) < (1 << 63) for s in range(SLOTS))


def test_fair_shares_cover_every_slot():
    assert [fair_share(n) for n in (0, 1, 2, 3, 64, 100)] == [SLOTS, SLOTS, 32, 22, 1, 1]
    assert all(fair_share(n) * n >= SLOTS for n in range(1, 70))
