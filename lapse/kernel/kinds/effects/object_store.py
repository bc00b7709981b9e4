"""`effect: {object-store: {url: …, key_column: …}}`: delete one object per operation (the
caller: processors/effects/object_store)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field
from sqlalchemy import String

from lapse.kernel.kinds.columns import column_of, reflected_type
from lapse.kernel.kinds.effects.base import CompileContext, ExternalEffectType
from lapse.kernel.kinds.errors import KindError, show


class ObjectStoreEffect(ExternalEffectType):
    """Delete one object per operation: `s3://bucket[/prefix]` on an S3-compatible store (optional
    `endpoint_url`, `region`; credentials from the usual AWS variables or files), or `file:PATH`
    for a folder (relative to the kinds file). The object key is read from `key_column`."""

    tag: ClassVar[str] = "object-store"
    destructive: ClassVar[bool] = True

    url: str = Field(min_length=1, max_length=2000)
    key_column: str = Field(min_length=1, max_length=63)
    endpoint_url: str | None = None
    region: str | None = None
    then_set: dict[str, Any] = Field(
        default_factory=dict, description="Columns set on the business row once the object is gone.")

    def checked(self, ctx: CompileContext) -> ObjectStoreEffect:
        """Check the store URL and key column; a relative `file:` folder resolves against the
        kinds file's folder, and the declaration handed on holds the absolute form."""
        field = self.field
        key = column_of(ctx.table, self.key_column, f"{field}.key_column")
        if not isinstance(reflected_type(key), String):
            raise KindError(f"{field}.key_column", f"column {show(key.name)} is not a text column")
        url = self.url
        if url.startswith("file:"):
            raw = url.removeprefix("file:")
            raw = raw[2:] if raw.startswith("//") else raw
            if not raw or "\0" in raw:
                raise KindError(f"{field}.url", "file: takes a folder, e.g. file:objects")
            folder = (ctx.base_dir / raw).resolve()
            return self.model_copy(update={"url": f"file:{folder}"})
        if url.startswith("s3://"):
            bucket = url.removeprefix("s3://").partition("/")[0]
            if not 3 <= len(bucket) <= 63 or not all(c.islower() or c.isdigit() or c in ".-" for c in bucket):
                raise KindError(f"{field}.url", f"no S3 bucket name in {show(url)}")
            if self.endpoint_url is not None and not self.endpoint_url.startswith(("http://", "https://")):
                raise KindError(f"{field}.endpoint_url", "expected an http:// or https:// URL")
            return self
        raise KindError(f"{field}.url", "expected s3://bucket[/prefix] or file:FOLDER")
