"""Declarations of the effects that run outside the database, and the one call an effect receives.

A declared kind's `http` or `object-store` effect is validated data here; the processors turn it
into a call at the edge. Every call carries the op key (a stable idempotency key) and the attempt,
so the far side can de-duplicate a call repeated after a lease takeover.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Declared(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HttpEffect(_Declared):
    """Call an HTTP endpoint per operation. `url` is a template over the business row's columns
    and `{op_key}`, `{subject_id}`, `{tenant}`; every placeholder value is URL-encoded."""

    method: Literal["POST", "PUT", "PATCH", "DELETE"] = "POST"
    url: str = Field(min_length=1, max_length=2000)
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(10.0, gt=0, le=300)
    then_set: dict[str, Any] = Field(
        default_factory=dict, description="Columns set on the business row once the call succeeded.")


class ObjectStoreEffect(_Declared):
    """Delete one object per operation: `s3://bucket[/prefix]` on an S3-compatible store (optional
    `endpoint_url`, `region`; credentials from the usual AWS variables or files), or `file:PATH`
    for a folder (relative to the kinds file). The object key is read from `key_column`."""

    url: str = Field(min_length=1, max_length=2000)
    key_column: str = Field(min_length=1, max_length=63)
    endpoint_url: str | None = None
    region: str | None = None
    then_set: dict[str, Any] = Field(
        default_factory=dict, description="Columns set on the business row once the object is gone.")


@dataclass(frozen=True, slots=True)
class EffectCall:
    """One attempt of an external effect for one operation. `target` holds the business row's
    values (column → value) read when the row was claimed."""

    kind: str
    op_key: str
    attempt: int
    subject_id: str
    tenant: str
    target: Mapping[str, Any]
