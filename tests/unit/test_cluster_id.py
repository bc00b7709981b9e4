"""The cluster id of brokers started from the jars is always a valid, non-option value."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from lapse.devtools.brokers.apache import cluster_id_from, random_cluster_id


@given(st.binary(min_size=16, max_size=16))
def test_an_id_is_never_read_as_an_option(raw: bytes) -> None:
    cluster_id = cluster_id_from(raw)
    if cluster_id is None:  # discarded draws are exactly those that would start with '-'
        assert base64.urlsafe_b64encode(raw).decode().startswith("-")
    else:
        assert len(cluster_id) == 22 and not cluster_id.startswith("-")
        assert base64.urlsafe_b64decode(cluster_id + "==") == raw


def test_a_dash_first_draw_is_discarded() -> None:
    assert cluster_id_from(base64.urlsafe_b64decode("-" + "A" * 21 + "==")) is None


def test_random_ids_are_valid() -> None:
    ids = {random_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000 and not any(i.startswith("-") for i in ids)
