"""The archive's pieces that take outside input or decide exactness, without a broker: the archive URL
(checked where it enters: anything is either a usable URL or one line), manifest entries read back
from a store anyone could change, the folder store's create-only commit point, a file read only
when it is the one its entry describes, and where a partition's file ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lapse.archive import ArchiveUrlError, FileDamaged, ManifestEntry, ManifestError, parse_archive_url
from lapse.archive.files import RECORDS, Spool, read_verified
from lapse.archive.locations import entry_key, topic_stream
from lapse.archive.segments import PartitionArchive
from lapse.archive.stores import FolderStore

STREAM = topic_stream("lapse.expiry", 3)


@given(st.text(max_size=300))
def test_any_text_is_an_archive_url_or_one_line_saying_why(text):
    try:
        url = parse_archive_url(text)
    except ArchiveUrlError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 300
        return
    assert url.scheme in ("s3", "file")
    assert parse_archive_url(str(url)) == url


@pytest.mark.parametrize(("url", "scheme", "bucket", "root"), [
    ("s3://lapse-archive/prod/eu", "s3", "lapse-archive", "prod/eu/"),
    ("s3://lapse-archive", "s3", "lapse-archive", ""),
    ("file:///var/lib/lapse/archive/", "file", None, "/var/lib/lapse/archive"),
    ("file://localhost/srv/a%20b", "file", None, "/srv/a b"),
])
def test_archive_urls_that_are_taken(url, scheme, bucket, root):
    checked = parse_archive_url(url)
    assert (checked.scheme, checked.bucket, checked.root) == (scheme, bucket, root)


@pytest.mark.parametrize("url", ["ftp://x/y", "s3://UPPER/x", "s3://b/../x", "s3://bb/a//b", "file:relative",
                                 "file://host/srv", "file:///srv/../etc", "s3://bucket/x?versionId=1", "",
                                 "file:///a\nb"])
def test_archive_urls_that_are_refused(url):
    with pytest.raises(ArchiveUrlError):
        parse_archive_url(url)


def _entry(**changes) -> ManifestEntry:
    fields = {"stream": STREAM, "partition": 3, "first": 10, "last": 19, "records": 10,
              "file": f"{STREAM}/date=2026-12-06/hour=10/x.avro", "sha256": "a" * 64, "size": 1234,
              "first_ms": 1, "last_ms": 2, "min_ms": 1, "max_ms": 2, "closed_ms": None}
    return ManifestEntry(**{**fields, **changes})


def test_an_entry_reads_back_as_written():
    entry = _entry()
    assert ManifestEntry.from_json(entry.to_json(), STREAM, 10) == entry
    assert entry.key == entry_key(STREAM, 10) and entry.end == 20


@pytest.mark.parametrize("changes", [
    {"first": 11}, {"last": 9}, {"records": 11}, {"sha256": "A" * 64}, {"file": "elsewhere/x.avro"},
    {"file": f"{STREAM}/../../x.avro"}, {"size": -1}, {"records": True}, {"first_ms": "yesterday"},
    {"file": None},
])
def test_an_entry_that_this_archive_would_not_write_is_refused(changes):
    with pytest.raises(ManifestError):
        ManifestEntry.from_json(json.dumps({"format": 1, **{**_entry().__dict__, **changes}}).encode(), STREAM, 10)


@given(st.binary(max_size=200) | st.builds(lambda d: json.dumps(d).encode(),
                                           st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=5))))
def test_any_bytes_are_an_entry_or_a_manifest_error(data):
    try:
        ManifestEntry.from_json(data, STREAM, 10)
    except ManifestError as exc:
        assert "\n" not in str(exc)


def test_a_folder_store_creates_an_entry_once_and_replaces_a_file(tmp_path):
    store = FolderStore(parse_archive_url(f"file://{tmp_path}"))
    assert store.create("m/1.json", b"first") is True
    assert store.create("m/1.json", b"second") is False
    assert store.read("m/1.json") == b"first"
    source = tmp_path / "src"
    for body in (b"one", b"two"):
        source.write_bytes(body)
        store.put_file("d/f.avro", source)
    assert store.read("d/f.avro") == b"two"
    assert list(store.keys("m/")) == ["m/1.json"] and list(store.keys("m/", start_after="m/1.json")) == []
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]


def _spool(tmp_path: Path, offsets: range) -> tuple[Path, str, int]:
    spool = Spool(RECORDS, tmp_path, {})
    for offset in offsets:
        spool.append({"offset": offset, "timestamp": offset, "timestamp_type": 1, "key": None, "value": b"v",
                      "headers": []})
    sealed = spool.seal()
    return sealed.path, sealed.sha256, sealed.size


def test_a_file_is_read_only_when_it_is_the_one_its_entry_describes(tmp_path):
    path, digest, size = _spool(tmp_path, range(5))
    assert [r["offset"] for r in read_verified(path, RECORDS, digest, size, "f")] == [0, 1, 2, 3, 4]
    with pytest.raises(FileDamaged, match="missing"):
        list(read_verified(None, RECORDS, digest, size, "f"))
    path.write_bytes(path.read_bytes()[:-1] + b"\0")
    with pytest.raises(FileDamaged, match="altered"):
        list(read_verified(path, RECORDS, digest, size, "f"))


def test_a_partition_file_ends_at_its_span_its_size_or_a_hole(tmp_path):
    part = PartitionArchive("t", 0, "topics/t/partition=0", None, RECORDS, tmp_path, span_ms=1000, max_records=3)
    record = {"offset": 0, "timestamp": 0, "timestamp_type": 1, "key": None, "value": None, "headers": []}
    part.append(0, record, 1_500)
    assert part.full_before(1, 1_999) is None  # the same span
    assert part.full_before(1, 1_200) is None  # an earlier time in the same file: it stays
    assert part.full_before(1, 2_000) is part.segment  # the next span
    assert part.full_before(2, 1_600) is part.segment  # offset 1 never came
    part.append(1, record, 1_600)
    part.append(2, record, 1_700)
    assert part.full_before(3, 1_800) is part.segment  # max_records
    assert part.due(now_ms=2_000, close_after_ms=500) is False and part.due(now_ms=2_500, close_after_ms=500)
    part.drop()
    assert (part.segment, part.position) == (None, None)
