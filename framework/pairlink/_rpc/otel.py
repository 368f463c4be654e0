"""OpenTelemetry spans for calls (the optional ``tracing`` extra): a SERVER span for each call a
service answers, a CLIENT span for each call made inside a trace, linked by the ``traceparent``
that OpenTelemetry's propagator puts in (and reads from) the application-properties.

Imported once, only by :func:`pairlink._rpc.tracing.opentelemetry_tracer` (so that importing
pairlink never imports OpenTelemetry); a server or client asks for the tracer when it starts
and, without one, makes no span at all.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import Token

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    NonRecordingSpan,
    ProxyTracerProvider,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    TraceState,
)

from pairlink._rpc import tracing
from pairlink._rpc.tracing import TraceContext
from pairlink.errors import RemoteError

SYSTEM = "pairlink"
STATUS_CODE = "rpc.response.status_code"
"""The span attribute of the call's status-code (200, 404, 500...)."""
ROWS = "pairlink.rows"
"""A batch's span: how many rows it carried."""
ROWS_FAILED = "pairlink.rows.failed"
"""A batch's span: how many of its rows failed (a status other than 200)."""


def tracer() -> Tracer | None:
    """pairlink's tracer, or None while the application has set no tracer provider."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider):
        return None
    return provider.get_tracer("pairlink")


def _attributes(service: str, operation: str) -> dict[str, str]:
    return {"rpc.system": SYSTEM, "rpc.service": service, "rpc.method": operation}


class ServerSpan:
    """The span of one call a service answers, started on arrival (its queueing counts), the
    parent read from the request's headers; current (for OpenTelemetry and as
    :func:`pairlink._rpc.tracing.current_trace`) while the call runs, ended by :meth:`finish`
    with the reply's status."""

    __slots__ = ("_token", "_trace", "span", "trace")

    def __init__(
        self, tracer: Tracer, service: str, operation: str, properties: Mapping[str, object]
    ) -> None:
        carrier = {str(k): v for k, v in properties.items() if isinstance(v, str)}
        self.span: Span = tracer.start_span(
            f"{service}/{operation}",
            context=propagate.extract(carrier),
            kind=SpanKind.SERVER,
            attributes=_attributes(service, operation),
        )
        ids = self.span.get_span_context()
        self.trace = TraceContext(
            format(ids.trace_id, "032x"),
            format(ids.span_id, "016x"),
            int(ids.trace_flags),
            ids.trace_state.to_header() or None,
        )

    def __enter__(self) -> None:
        self._token: Token[Context] = otel_context.attach(trace.set_span_in_context(self.span))
        self._trace = tracing.use_trace(self.trace)
        self._trace.__enter__()

    def __exit__(self, *_exc: object) -> None:
        self._trace.__exit__()
        otel_context.detach(self._token)

    def finish(self, status: int | None, rows: Sequence[int] = ()) -> None:
        """End the span with the reply's status; a batch's with its rows' count and how many
        failed (``rows``: each row's status)."""
        if rows:
            self.span.set_attribute(ROWS, len(rows))
            self.span.set_attribute(ROWS_FAILED, sum(1 for status in rows if status != 200))
        if status is not None:
            self.span.set_attribute(STATUS_CODE, status)
            if status >= 500:
                self.span.set_status(Status(StatusCode.ERROR, f"status {status}"))
        self.span.end()


@contextmanager
def client_span(tracer: Tracer, service: str, operation: str) -> Iterator[dict[str, str] | None]:
    """A CLIENT span around one call, if a trace is current (an OpenTelemetry span, or else
    :func:`pairlink._rpc.tracing.current_trace`): yields the headers that carry it, or None
    (no trace: no span, no header)."""
    parent = None
    if not trace.get_current_span().get_span_context().is_valid:
        plain = tracing.current_trace()
        if plain is None:
            yield None
            return
        parent = trace.set_span_in_context(NonRecordingSpan(_span_context(plain)))
    span = tracer.start_span(
        f"{service}/{operation}",
        context=parent,
        kind=SpanKind.CLIENT,
        attributes=_attributes(service, operation),
    )
    headers: dict[str, str] = {}
    propagate.inject(headers, context=trace.set_span_in_context(span, parent))
    try:
        yield headers
    except RemoteError as exc:
        span.set_attribute(STATUS_CODE, exc.status)
        span.set_status(Status(StatusCode.ERROR, exc.message))
        raise
    except BaseException as exc:
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        span.end()


def _span_context(plain: TraceContext) -> SpanContext:
    state = TraceState.from_header([plain.state]) if plain.state else None
    return SpanContext(
        int(plain.trace_id, 16),
        int(plain.span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(plain.flags),
        trace_state=state,
    )
