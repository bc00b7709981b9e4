"""What a kind declares about what it calls and its place in the queue (lapse/kernel/kinds/limits.py):
limits of a positive rate and concurrency, per kind, endpoint or tenant, on external effects only;
a priority of high or normal; tenant weights above 0 for tenants the kind can have. Anything else
is one line naming the kind and the field, before a database is seen."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from lapse.kernel.kinds.declarations import DeclaredKind, parse_kind
from lapse.kernel.kinds.errors import KindError
from lapse.kernel.kinds.limits import Limits
from lapse.kernel.settings import env_var
from lapse.shell.app import main
from lapse.shell.error_boundary import ExitCode

HTTP = {"http": {"url": "https://partner.example/{id}"}}
RATE = "limits.rate_per_s: a rate (calls per second)"
CONCURRENCY = "limits.concurrency: a concurrency (calls in flight)"
BASE = {"table": "t", "id": "id", "tenant": "tenant_id", "due": "d", "effect": HTTP}


def declared(**extra) -> DeclaredKind:
    decl = parse_kind("k", {**BASE, **extra})
    assert isinstance(decl, DeclaredKind)
    return decl


def refused(**extra) -> str:
    with pytest.raises(KindError) as caught:
        declared(**extra)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(("extra", "message"), [
    ({"limits": {"rate_per_s": 0}}, f"{RATE} is above 0 and at most 100000, not 0"),
    ({"limits": {"rate_per_s": -5}}, f"{RATE} is above 0 and at most 100000, not -5"),
    ({"limits": {"rate_per_s": 1e9}}, f"{RATE} is above 0 and at most 100000"),
    ({"limits": {"rate_per_s": "100"}}, f"{RATE} is a number, not '100'"),
    ({"limits": {"rate_per_s": "fast"}}, f"{RATE} is a number, not 'fast'"),
    ({"limits": {"rate_per_s": True}}, f"{RATE} is a number, not True"),
    ({"limits": {"rate_per_s": float("nan")}}, f"{RATE} is a number, not nan"),
    ({"limits": {"concurrency": 0}}, f"{CONCURRENCY} is 1 to 10000, not 0"),
    ({"limits": {"concurrency": -1}}, f"{CONCURRENCY} is 1 to 10000, not -1"),
    ({"limits": {"concurrency": 2.5}}, f"{CONCURRENCY} is a whole number, not 2.5"),
    ({"limits": {"concurrency": "8"}}, f"{CONCURRENCY} is a whole number, not '8'"),
    ({"limits": {"per": "host"}}, "limits.per: Input should be 'kind', 'endpoint' or 'tenant'"),
    ({"limits": {"burst": 5}}, "limits.burst: Extra inputs are not permitted"),
    ({"limits": 100}, "limits: Input should be a valid dictionary or instance of LimitsDecl"),
    ({"effect": {"delete": {}}, "limits": {"rate_per_s": 10, "per": "endpoint"}},
     "(kind): limits apply to http, object-store and kafka-produce effects only: a delete effect calls no endpoint"),
    ({"effect": {"update": {"set": {"s": "x"}}}, "limits": {"concurrency": 2}},
     "(kind): limits apply to http, object-store and kafka-produce effects only: a update effect calls no endpoint"),
    ({"rate_per_s": 100}, "(kind): rate_per_s is now limits.rate_per_s, counted for all workers together"),
    ({"priority": "urgent"}, "priority: Input should be 'high' or 'normal'"),
    ({"priority": 1}, "priority: Input should be 'high' or 'normal'"),
    ({"tenant_weights": {"acme": 0}}, "tenant_weights: the weight of tenant 'acme' is above 0 and at most 1000, not 0"),
    ({"tenant_weights": {"acme": -2}}, "tenant_weights: the weight of tenant 'acme' is above 0 and at most 1000"),
    ({"tenant_weights": {"acme": "heavy"}}, "tenant_weights: the weight of tenant 'acme' is a number, not 'heavy'"),
    ({"tenant_weights": {"": 2}}, "tenant_weights: '' cannot be a tenant (1 to 64 printable characters)"),
    ({"tenant_weights": {"x" * 65: 2}}, "tenant_weights: 'xxxxxxxx"),
    ({"tenant_weights": {"a\nb": 2}}, "tenant_weights: 'a\\nb' cannot be a tenant"),
    ({"tenant_weights": [3]}, "tenant_weights: expected a mapping of tenant to weight, e.g. {acme: 3}"),
    ({"tenant": None, "tenant_weights": {"acme": 2}},
     "(kind): tenant_weights: 'acme' is not a tenant of this kind: it declares no tenant column, so every row is "
     "tenant 'default'"),
])
def test_wrong_limits_priorities_and_weights_are_one_line_naming_the_field(extra, message):
    assert refused(**extra).startswith(message)


def test_what_a_good_declaration_says():
    decl = declared(limits={"rate_per_s": 50, "concurrency": 4, "per": "endpoint"}, priority="high",
                    tenant_weights={"acme": 3, "globex": 0.5})
    assert decl.limits is not None and decl.limits.limits() == Limits(50.0, 4, "endpoint")
    assert (decl.priority, decl.tenant_weights) == ("high", {"acme": 3.0, "globex": 0.5})
    plain = declared()
    assert (plain.limits, plain.priority, plain.tenant_weights) == (None, "normal", {})
    assert declared(tenant=None, tenant_weights={"default": 2}).tenant_weights == {"default": 2.0}


@given(rate=st.one_of(st.integers(-10, 200_000), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
                      st.booleans(), st.none()))
def test_a_rate_is_accepted_exactly_when_it_is_a_number_above_0_up_to_100000(rate):
    number = isinstance(rate, (int, float)) and not isinstance(rate, bool)
    valid = number and rate == rate and 0 < rate <= 100_000
    try:
        decl = declared(limits={"rate_per_s": rate})
    except KindError as exc:
        assert not valid and str(exc).startswith("limits.rate_per_s: ") and "\n" not in str(exc)
    else:
        assert valid and decl.limits is not None and decl.limits.rate_per_s == rate


@pytest.mark.parametrize(("limits", "says"), [
    ("{rate_per_s: 0}", "limits.rate_per_s: a rate (calls per second) is above 0 and at most 100000, not 0"),
    ("{rate_per_s: -3}", "limits.rate_per_s: a rate (calls per second) is above 0 and at most 100000, not -3"),
    ("{rate_per_s: fast}", "limits.rate_per_s: a rate (calls per second) is a number, not 'fast'"),
    ("{concurrency: 0}", "limits.concurrency: a concurrency (calls in flight) is 1 to 10000, not 0"),
])
def test_a_wrong_limit_ends_a_command_in_one_line_and_exit_3(tmp_path, limits, says):
    """What an operator sees: `lapse kinds list` on such a file, exit 3 (configuration invalid)."""
    path = tmp_path / "kinds.yaml"
    path.write_text(f"kinds:\n  notify:\n    table: t\n    id: id\n    due: d\n"
                    f"    effect: {{http: {{url: 'https://partner.example/{{id}}'}}}}\n    limits: {limits}\n")
    done = CliRunner().invoke(main, ["kinds", "list"], env={env_var("kinds.file"): str(path),
                                                             env_var("database.url"): f"sqlite:///{tmp_path}/x.db"})
    assert done.exit_code == ExitCode.CONFIG
    assert done.output.strip() == f"lapse: {path}: kind 'notify': {says}"
