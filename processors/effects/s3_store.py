"""An S3-compatible object store through boto3, for `object-store` effects on `s3://bucket[/prefix]`.

Delete is DeleteObject, idempotent on S3 (204 whether or not the key existed); a store that says
NoSuchKey / 404 instead is done too. botocore's own retries are off: Lapse retries with its
persisted backoff and needs every failure classified (S3 error codes, and whether the request
was sent before the connection failed).
"""

from __future__ import annotations

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
from botocore.exceptions import ConnectionError as NotConnected

from lapse.kernel.text import one_line
from lapse.processors.effects.object_stores import object_key
from lapse.processors.failures import (
    AMBIGUOUS,
    INVALID,
    RATE_LIMITED,
    TEMPORARY,
    EffectFailure,
    for_status,
    retry_after_wait,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

DONE = frozenset({"NoSuchKey", "NotFound"})
SLOW_DOWN = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                       "TooManyRequests", "TooManyRequestsException"})
TRY_AGAIN = frozenset({"InternalError", "ServiceUnavailable", "RequestTimeout", "OperationAborted"})
NEVER = frozenset({"AccessDenied", "AllAccessDisabled", "InvalidRequest", "InvalidArgument",
                   "KeyTooLongError", "NoSuchBucket", "InvalidBucketName", "InvalidAccessKeyId",
                   "SignatureDoesNotMatch", "MethodNotAllowed"})


class S3ObjectStore:
    """Objects in one bucket under a key prefix (`s3://bucket/exports` → keys `exports/…`).
    One client, shared by the effect threads (boto3 clients are thread-safe)."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, max_connections: int = 10,
                 connect_timeout_s: float = 5.0, read_timeout_s: float = 15.0) -> None:
        if not bucket:
            raise ValueError("an s3:// object store URL needs a bucket: s3://bucket[/prefix]")
        prefix = prefix.lstrip("/")
        self.bucket = bucket
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        config = Config(retries={"total_max_attempts": 1}, connect_timeout=connect_timeout_s,
                        read_timeout=read_timeout_s, max_pool_connections=max_connections)
        self.client: S3Client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config)

    def delete(self, key: str) -> bool:
        full = object_key(self.prefix, key)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=full)
        except ClientError as exc:
            failure = s3_failure(exc, full)
            if failure is None:
                return False
            raise failure from None
        except BotoCoreError as exc:
            raise transport_failure(exc) from None
        return True

    def close(self) -> None:
        self.client.close()


def s3_failure(exc: ClientError, key: str) -> EffectFailure | None:
    """The failure an S3 error answer means, or None when it means the object is gone."""
    error = exc.response.get("Error", {})
    meta = exc.response.get("ResponseMetadata", {})
    code, status = error.get("Code", ""), int(meta.get("HTTPStatusCode", 0))
    reason = (f"S3 {code or 'error'} ({status}) deleting {one_line(key, 80)!r}: "
              f"{one_line(error.get('Message', ''), 100)}")
    if code in DONE or (status == 404 and code != "NoSuchBucket"):
        return None
    if code in SLOW_DOWN or status == 429:
        headers = meta.get("HTTPHeaders", {})
        wait = retry_after_wait(headers.get("retry-after"), headers.get("date"))
        return EffectFailure(RATE_LIMITED, reason, retry_after=wait, slow_down=True, stop_route=True)
    if code in TRY_AGAIN:
        return EffectFailure(TEMPORARY, reason)
    if code in NEVER:
        return EffectFailure(INVALID, reason)
    return for_status(status, reason) or EffectFailure(TEMPORARY, reason)


def transport_failure(exc: BotoCoreError) -> EffectFailure:
    """A failure with no S3 answer: not connected (endpoint unreachable, connect timeout, proxy,
    TLS) is temporary; a request botocore refused to build, or missing credentials, invalid;
    anything after the request was sent (a read timeout, a connection cut off) ambiguous."""
    reason = f"S3 {type(exc).__name__}: {one_line(str(exc), 160)}"
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError, ParamValidationError)):
        return EffectFailure(INVALID, reason)
    if isinstance(exc, NotConnected):
        return EffectFailure(TEMPORARY, reason)
    return EffectFailure(AMBIGUOUS, reason)
