"""Spans of Lapse's stages (docs/design/traces.md): a publish, a sweep page, a processor's batch
step, an effect call, a relay batch.

Spans are recorded once `use` was handed an OpenTelemetry tracer provider (the roles build one from
the `tracing` settings; a test hands its own). Until then the roles' functions here return at once
and import nothing of OpenTelemetry: the carried `traceparent` (`lapse.kernel.trace_context`) is all
that travels. The publish API, which runs in the application's process, uses the application's own
tracer provider instead when Lapse's is not set. A batch step is one span per sampled trace among its
records (and one for the records that carry none), so its cost follows the sample ratio.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from importlib.util import find_spec
from typing import Any

from lapse.kernel.trace_context import is_sampled

# The spans' names, one per stage.
PUBLISH, SWEEP, PROCESS, EFFECT, RELAY = "lapse.publish", "lapse.sweep", "lapse.process", "lapse.effect", "lapse.relay"
# Most op keys a stage's span lists (`lapse.op_keys`), to find a trace by its operation.
OP_KEYS = 20
Attributes = Mapping[str, str | int | float | bool | list[str]]


class _Active:
    """This process's tracer (None: no spans) and the OpenTelemetry trace API, once imported."""

    tracer: Any = None
    api: Any = None
    app_api: Any = None  # the API for the publish path's fallback, or False when not installed


_active = _Active()


def use(provider: Any) -> None:
    """Record spans with `provider` (an OpenTelemetry TracerProvider) from now on in this process;
    None stops recording."""
    if provider is None:
        _active.tracer = None
        return
    # function-local: OpenTelemetry is an optional extra (`otel`), imported only once tracing is on
    from opentelemetry import trace

    _active.api = trace
    _active.tracer = provider.get_tracer("lapse")


def enabled() -> bool:
    """Whether this process records spans."""
    return _active.tracer is not None


@contextmanager
def span(name: str, parent: str | None, attributes: Attributes | None = None) -> Iterator[str | None]:
    """One span of a stage, child of `parent` (a valid traceparent; None: of the current context,
    else the root of a new trace). Yields the traceparent to carry on: the span's own when spans are
    recorded, else `parent`."""
    tracer = _active.tracer
    if tracer is None:
        yield parent
        return
    with tracer.start_as_current_span(name, context=_context(parent), attributes=attributes) as current:
        yield _traceparent(current) or parent


@contextmanager
def publish_span(name: str, parent: str | None, attributes: Attributes | None = None) -> Iterator[str | None]:
    """`span` for the publish API: with no tracer of Lapse's set, the application's own (through
    the OpenTelemetry API, when installed: its active span is the parent, its provider records),
    and the application's active trace context carried when nothing records."""
    if _active.tracer is not None:
        with span(name, parent, attributes) as carried:
            yield carried
        return
    api = _app_api()
    if api is None:
        yield parent
        return
    tracer = api.get_tracer("lapse")
    with tracer.start_as_current_span(name, context=_context(parent, api), attributes=attributes) as current:
        yield _traceparent(current) or parent


@contextmanager
def stage(name: str, traced: Iterable[tuple[str | None, str]], attributes: Attributes | None = None
          ) -> Iterator[None]:
    """The spans of one batch step over records (`traced`: each record's traceparent and op key,
    read only when spans are recorded): one child span of each sampled trace among them, one new
    trace for those that carry none; all start and end with the step, and an error ends them failed."""
    tracer = _active.tracer
    if tracer is None:
        yield
        return
    groups: dict[str | None, list[str]] = {}
    for traceparent, op_key in traced:
        if traceparent is None or is_sampled(traceparent):
            groups.setdefault(traceparent, []).append(op_key)
    spans = [tracer.start_span(name, context=_context(parent),
                               attributes={**(attributes or {}), "lapse.events": len(keys),
                                           "lapse.op_keys": keys[:OP_KEYS]})
             for parent, keys in groups.items()]
    try:
        yield
    except BaseException as exc:
        status = _active.api.Status(_active.api.StatusCode.ERROR, f"{type(exc).__name__}")
        for each in spans:
            each.record_exception(exc)
            each.set_status(status)
        raise
    finally:
        for each in spans:
            each.end()


def _context(parent: str | None, api: Any = None) -> Any:
    """The OpenTelemetry context whose span is the remote `parent` (None: the current context)."""
    if parent is None:
        return None
    api = api or _active.api
    _, trace_id, span_id, flags = parent.split("-")
    remote = api.SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                             trace_flags=api.TraceFlags(int(flags, 16)))
    return api.set_span_in_context(api.NonRecordingSpan(remote))


def _traceparent(current: Any) -> str | None:
    """The traceparent of a span (None for an invalid one: a no-op tracer's)."""
    context = current.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _app_api() -> Any:
    """The OpenTelemetry trace API for the publish path's fallback, or None when not installed."""
    if _active.app_api is None:
        if find_spec("opentelemetry") is None:
            _active.app_api = False
        else:
            # function-local: OpenTelemetry is an optional extra, imported only where it is installed
            from opentelemetry import trace

            _active.app_api = trace
    return _active.app_api or None
