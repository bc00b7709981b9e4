"""Starting a role's tracing from the `tracing` settings: the OpenTelemetry SDK (the `otel` extra)
with its OTLP/HTTP exporter, spans sent in batches, new traces sampled at `sample_ratio`."""

from __future__ import annotations

from importlib.util import find_spec

from lapse.kernel import tracing
from lapse.kernel.settings import Settings, env_var
from lapse.shell.startup_checks import StartupRefused

# The modules of the `otel` extra a role needs to send spans.
OTEL_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")


def start_tracing(settings: Settings) -> None:
    """Record this process's spans and send them to `tracing.endpoint`; nothing when it is unset or
    spans are recorded already. Raises StartupRefused when the `otel` extra is not installed."""
    endpoint = settings.tracing.endpoint
    if endpoint is None or tracing.enabled():
        return
    missing = next((m for m in OTEL_MODULES if not _installed(m)), None)
    if missing is not None:
        raise StartupRefused(f"{env_var('tracing.endpoint')} is set but {missing} is not installed: "
                             "pip install 'lapse[otel]', or unset it")
    # function-local: the SDK and exporter are an optional extra, imported only when traces are sent
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: settings.tracing.service_name}),
                              sampler=ParentBased(TraceIdRatioBased(settings.tracing.sample_ratio)))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    tracing.use(provider)


def _installed(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False
