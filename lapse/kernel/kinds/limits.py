"""What a kind declares about protecting what it calls and about its place in the queue: its call
limits (a rate and a concurrency shared by every worker), its priority and its tenants' weights.

How the limits are kept for the whole deployment and how the sweep shares its pages between
tenants: docs/design/limits.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lapse.kernel.kinds.errors import show

Scope = Literal["kind", "endpoint", "tenant"]
Priority = Literal["high", "normal"]
DEFAULT_RATE_PER_S = 100.0
MAX_RATE_PER_S = 100_000
MAX_CONCURRENCY = 10_000
MAX_WEIGHT = 1000
MAX_WEIGHTS = 1000
TENANT_CHARS = 64  # the ledger's tenant column
DEFAULT_TENANT = "default"  # the tenant of every row of a table without a tenant column
PRIORITY_HELP = ("`high`: the sweep emits this kind's due work before any `normal` kind's in every round, "
                 "and a worker starts its calls first.")
WEIGHTS_HELP = ("Each named tenant's share of the sweep's pages against the others' (unnamed tenants weigh 1): "
                "a tenant of weight 3 gets three rows for every row of a tenant of weight 1 while both have due work.")
LIMITS_HELP = ("Calls of the external effect, counted for every worker at once. Unset: 100 calls per second for "
               "the whole kind, concurrency bounded per worker only.")


def _number(value: Any, what: str, low: float, high: float) -> float:
    """A number of the file (not a string, not a boolean) within (low, high]; ValueError saying so."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} is a number, not {show(value)}")
    if not low < value <= high:
        raise ValueError(f"{what} is above {low:g} and at most {high:g}, not {show(value)}")
    return float(value)


class LimitsDecl(BaseModel):
    """At most `rate_per_s` calls a second and `concurrency` calls in flight, for every worker at
    once, shared by the whole kind, by each endpoint it calls (an HTTP host and port, a bucket, a
    topic) or by each tenant (`per`). A 429 halves that rate for every worker, which then climbs back
    to `rate_per_s`; a Retry-After stops every worker's calls under the limit until then."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=False)

    rate_per_s: float = Field(DEFAULT_RATE_PER_S, description="Calls per second, all workers together.")
    concurrency: int | None = Field(None, description="Calls in flight, all workers together (unset: each "
                                                      "worker's processor.effect_concurrency).")
    per: Scope = Field("kind", description="What shares one limit: the kind, each endpoint, or each tenant.")

    @field_validator("rate_per_s", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> float:
        return _number(value, "a rate (calls per second)", 0, MAX_RATE_PER_S)

    @field_validator("concurrency", mode="before")
    @classmethod
    def _concurrency(cls, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"a concurrency (calls in flight) is a whole number, not {show(value)}")
        if not 1 <= value <= MAX_CONCURRENCY:
            raise ValueError(f"a concurrency (calls in flight) is 1 to {MAX_CONCURRENCY}, not {show(value)}")
        return value

    def limits(self) -> Limits:
        return Limits(self.rate_per_s, self.concurrency, self.per)


@dataclass(frozen=True)
class Limits:
    """A kind's call limits as the workers apply them (`LimitsDecl` compiled)."""

    rate_per_s: float = DEFAULT_RATE_PER_S
    concurrency: int | None = None
    per: Scope = "kind"


def checked_weights(value: Any) -> dict[str, float]:
    """`{tenant: weight}`: tenants as the ledger holds them (1 to 64 printable characters), weights
    above 0 and at most 1000; ValueError naming the first one that is not."""
    if not isinstance(value, dict):
        raise ValueError("expected a mapping of tenant to weight, e.g. {acme: 3}")
    if len(value) > MAX_WEIGHTS:
        raise ValueError(f"at most {MAX_WEIGHTS} tenants are weighed")
    out: dict[str, float] = {}
    for tenant, weight in value.items():
        if not isinstance(tenant, str) or not 1 <= len(tenant) <= TENANT_CHARS or not tenant.isprintable():
            raise ValueError(f"{show(tenant)} cannot be a tenant (1 to {TENANT_CHARS} printable characters)")
        out[tenant] = _number(weight, f"the weight of tenant {show(tenant)}", 0, MAX_WEIGHT)
    return out


def unknown_weights(weights: dict[str, float], has_tenant_column: bool) -> str | None:
    """Why a weight names a tenant the kind cannot have (every row of a table without a tenant
    column is tenant 'default'), or None."""
    if has_tenant_column:
        return None
    unknown = sorted(t for t in weights if t != DEFAULT_TENANT)
    if not unknown:
        return None
    return (f"{show(unknown[0])} is not a tenant of this kind: it declares no tenant column, so every row is "
            f"tenant {DEFAULT_TENANT!r}")
