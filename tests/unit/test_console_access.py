"""The console's rules that take outside input, as properties: token strength, the `Host` names it
answers to and the `Origin` it takes a change from, the sign-in limits, the names an open console
records, relative times and chart axes."""

from __future__ import annotations

import secrets
import string
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from starlette.datastructures import Headers

from lapse.kernel.settings import MIN_TOKEN_CHARS, ConsoleSettings, weak_token
from lapse.shell.console.access import LOCAL_NAME, AccessRefused, SignInLimits
from lapse.shell.console.charts import nice_ceiling
from lapse.shell.console.guard import HostPolicy, RequestGuard, split_host
from lapse.shell.console.times import relative

pytestmark = pytest.mark.unit


@given(st.integers(min_value=12, max_value=48))
def test_generated_tokens_are_strong_enough(n):
    assert weak_token(secrets.token_urlsafe(n)) is None
    assert weak_token(secrets.token_hex(max(n, 16))) is None


@given(st.text(max_size=MIN_TOKEN_CHARS - 1))
def test_short_tokens_are_weak(token):
    assert "characters" in (weak_token(token) or "")


@given(st.text(alphabet=st.sampled_from("ab1"), min_size=MIN_TOKEN_CHARS, max_size=200))
def test_tokens_of_few_characters_are_weak(token):
    assert weak_token(token) is not None


@given(st.text(alphabet=string.digits, min_size=MIN_TOKEN_CHARS, max_size=23))
def test_short_runs_of_digits_are_weak(token):
    assert weak_token(token) is not None


def test_settings_refuse_weak_and_shared_tokens_and_half_a_tls_pair():
    with pytest.raises(ValidationError, match="the token of 'alice'"):
        ConsoleSettings(operator_tokens={"alice": "short"})
    same = secrets.token_urlsafe(24)
    with pytest.raises(ValidationError, match="two console tokens are the same"):
        ConsoleSettings(operator_tokens={"alice": same}, viewer_tokens={"victor": same})
    with pytest.raises(ValidationError, match="tls_cert and tls_key go together"):
        ConsoleSettings(tls_cert="/x.pem")
    with pytest.raises(ValidationError, match="secret_key"):
        ConsoleSettings(secret_key="too-short")


_labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
names = st.lists(_labels, min_size=1, max_size=4).map(".".join)


@given(names, st.one_of(st.none(), st.integers(1, 65535)))
def test_only_configured_names_localhost_and_the_bind_answer(name, port):
    policy = HostPolicy(ConsoleSettings(allowed_hosts=["console.example.com"]))
    host = split_host(f"{name}:{port}" if port else name)
    assert host is not None and host[0] == name
    assert policy.allows(host[0]) == (name in ("localhost", "console.example.com"))


@given(st.ip_addresses())
def test_ip_literals_answer_where_the_bind_takes_them(ip):
    loopback, wildcard = HostPolicy(ConsoleSettings()), HostPolicy(ConsoleSettings(bind="0.0.0.0"))
    assert loopback.allows(str(ip)) == ip.is_loopback
    assert wildcard.allows(str(ip))


LATIN_1 = st.characters(max_codepoint=255)  # header bytes, as ASGI servers decode them


@given(st.text(alphabet=LATIN_1, max_size=60))
def test_any_host_header_is_either_parsed_or_refused(value):
    guard = RequestGuard(lambda *_: None, ConsoleSettings())
    refusal = guard.refusal("GET", Headers({"host": value}))
    assert refusal is None or refusal[0] == 421


@given(st.sampled_from(["POST", "PUT", "DELETE", "PATCH"]),
       st.one_of(st.none(), st.text(alphabet=LATIN_1, max_size=40)))
def test_a_change_needs_the_consoles_own_origin(method, origin):
    guard = RequestGuard(lambda *_: None, ConsoleSettings())
    headers = {"host": "127.0.0.1:8088", **({"origin": origin} if origin is not None else {})}
    refusal = guard.refusal(method, Headers(headers))
    own = {f"{scheme}://127.0.0.1:8088{end}" for scheme in ("http", "https") for end in ("", "/")}
    assert (refusal is None) == (origin in own)
    assert guard.refusal(method, Headers({**headers, "authorization": "Bearer x"})) is None


def test_sign_in_limits_refuse_even_a_right_token_while_over():
    limits = SignInLimits(per_client=2, overall=3, window_s=60)
    for _ in range(2):
        limits.check("a")
        limits.failed("a")
    with pytest.raises(AccessRefused) as refused:
        limits.check("a")
    assert refused.value.status == 429 and refused.value.retry_after_s
    limits.check("b")
    limits.failed("b")
    with pytest.raises(AccessRefused):
        limits.check("c")  # the overall limit


@given(st.text(max_size=80))
def test_open_console_names_are_plain(name):
    if LOCAL_NAME.fullmatch(name):
        assert 1 <= len(name) <= 64 and all(c.isascii() and (c.isalnum() or c in "._@-") for c in name)


@given(st.integers(-10**8, 10**8))
def test_relative_times_name_one_unit(seconds):
    now = datetime(2026, 12, 6, tzinfo=UTC)
    said = relative(now - timedelta(seconds=seconds), now)
    assert said == "just now" or said.endswith(" ago") == (seconds > 0)


@given(st.floats(min_value=0, max_value=1e12))
def test_chart_axes_round_up_to_one_two_or_five(value):
    top = nice_ceiling(value)
    assert max(value, 1) <= top < max(value, 1) * 2.5 + 1e-6
    assert f"{top:.0e}".split("e")[0] in ("1", "2", "5")
