"""The archive on an S3-compatible store through boto3 (`s3://bucket/prefix`).

A file goes up in one `PutObject` (the object appears whole or not at all; a file stays far below
S3's 5 GB limit of one PUT at `archive.max_file_records`); a manifest entry with `PutObject` and
`If-None-Match: *`,
which S3 and compatible stores refuse with 412 when the key exists. Answers that mean "not this
way, ever" (no bucket, access denied, no credentials) are `ArchiveRefused`; anything else that
failed (not connected, timeouts, 5xx, throttling, a concurrent conditional write) is
`ArchiveUnavailable`, retried by the archive role after a backoff.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    ParamValidationError,
    PartialCredentialsError,
)

from lapse.archive.locations import ArchiveUrl
from lapse.archive.stores import ArchiveRefused, ArchiveUnavailable
from lapse.kernel.text import one_line

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

REFUSED = frozenset({"AccessDenied", "AllAccessDisabled", "NoSuchBucket", "InvalidBucketName",
                     "InvalidAccessKeyId", "SignatureDoesNotMatch", "AuthorizationHeaderMalformed",
                     "PermanentRedirect", "InvalidRequest", "MethodNotAllowed", "NotImplemented"})
ABSENT = frozenset({"NoSuchKey", "NotFound", "404"})
EXISTS = frozenset({"PreconditionFailed", "412"})


class S3ArchiveStore:
    """The archive under `url`'s key prefix in its bucket; one client (thread-safe)."""

    def __init__(self, url: ArchiveUrl, *, endpoint_url: str | None = None, region: str | None = None,
                 connect_timeout_s: float = 5.0, read_timeout_s: float = 30.0) -> None:
        assert url.bucket is not None, "an s3 archive URL has a bucket"
        self.url = url
        self.bucket = url.bucket
        self.prefix = url.root
        config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=connect_timeout_s,
                        read_timeout=read_timeout_s)
        self.client: S3Client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config)

    def put_file(self, key: str, path: Path) -> None:
        with self._answers(key), path.open("rb") as body:
            self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=body)

    def create(self, key: str, data: bytes) -> bool:
        try:
            with self._answers(key):
                self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data, IfNoneMatch="*")
        except _Exists:
            return False
        return True

    def read(self, key: str) -> bytes | None:
        try:
            with self._answers(key):
                return self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read()
        except _Absent:
            return None

    def fetch(self, key: str, dest: Path) -> Path | None:
        try:
            with self._answers(key), dest.open("wb") as out:
                body = self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"]
                for chunk in body.iter_chunks(1 << 20):
                    out.write(chunk)
        except _Absent:
            dest.unlink(missing_ok=True)
            return None
        return dest

    def keys(self, folder: str, start_after: str | None = None) -> Iterator[str]:
        kwargs = {"Bucket": self.bucket, "Prefix": self.prefix + folder}
        if start_after is not None:
            kwargs["StartAfter"] = self.prefix + start_after
        with self._answers(folder):
            for page in self.client.get_paginator("list_objects_v2").paginate(**kwargs):  # type: ignore[arg-type]
                for item in page.get("Contents", []):
                    yield item["Key"][len(self.prefix):]

    def close(self) -> None:
        self.client.close()

    @contextlib.contextmanager
    def _answers(self, key: str) -> Iterator[None]:
        """The store's answer as the archive reads it: absent, exists, refused or unavailable."""
        where = f"s3://{self.bucket}/{one_line(self.prefix + key, 120)}"
        try:
            yield
        except ClientError as exc:
            error = exc.response.get("Error", {})
            status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            code = error.get("Code", "") or status
            if code in ABSENT or (status == "404" and code != "NoSuchBucket"):
                raise _Absent() from None
            if code in EXISTS:
                raise _Exists() from None
            message = f"{where}: S3 {code} ({status}): {one_line(error.get('Message', ''), 120)}"
            if code in REFUSED or status in ("401", "403"):
                raise ArchiveRefused(message) from None
            raise ArchiveUnavailable(message) from None
        except (NoCredentialsError, PartialCredentialsError, ParamValidationError) as exc:
            raise ArchiveRefused(f"{where}: {one_line(str(exc), 160)}") from None
        except BotoCoreError as exc:
            raise ArchiveUnavailable(f"{where}: {type(exc).__name__}: {one_line(str(exc), 160)}") from None


class _Absent(Exception):
    """No object under the key."""


class _Exists(Exception):
    """An object is under the key already (a create-only write refused)."""
