"""Which tracing a server or client does: OpenTelemetry spans (:mod:`pairlink._rpc.otel`) when
OpenTelemetry is installed and the application has set a tracer provider, else the plain W3C
propagation of :mod:`pairlink._rpc.tracing`. OpenTelemetry is imported here, once, the first
time a server or client starts (never by ``import pairlink``); each asks for its tracer then,
and without one pays nothing per call.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import ModuleType
from typing import TYPE_CHECKING

from pairlink._rpc.tracing import TraceScope, continued, use_trace

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


def server_scope(
    tracer: Tracer | None, service: str, operation: str, properties: Mapping[str, object] | None
) -> TraceScope | None:
    """The trace a served call runs in: an OpenTelemetry SERVER span when there is a
    ``tracer`` (whose parent the request's headers give), else the caller's trace continued
    when the request carries one, else None."""
    if tracer is not None:
        assert _otel is not None, "a tracer comes from opentelemetry_tracer()"
        span: TraceScope = _otel.ServerSpan(tracer, service, operation, properties or {})
        return span
    trace = None if properties is None else continued(properties)
    return None if trace is None else use_trace(trace)


def client_span(
    tracer: Tracer, service: str, operation: str
) -> AbstractContextManager[dict[str, str] | None]:
    """A CLIENT span around one call when a trace is current; yields the headers to send
    (None: no trace). ``tracer`` is what :func:`opentelemetry_tracer` gave."""
    assert _otel is not None, "a tracer comes from opentelemetry_tracer()"
    span: AbstractContextManager[dict[str, str] | None] = _otel.client_span(
        tracer, service, operation
    )
    return span


_otel: ModuleType | None = None
_otel_checked = False


def opentelemetry_tracer() -> Tracer | None:
    """pairlink's OpenTelemetry tracer if OpenTelemetry is installed and the application has
    set a tracer provider (the SDK's): without one every span would be dropped anyway, so a
    server or client asks once, when it starts, and pays nothing per call otherwise."""
    global _otel, _otel_checked
    if not _otel_checked:
        _otel_checked = True
        try:
            from pairlink._rpc import otel
        except ImportError:  # OpenTelemetry is an optional extra (``tracing``)
            return None
        _otel = otel
    if _otel is None:
        return None
    tracer: Tracer | None = _otel.tracer()
    return tracer
