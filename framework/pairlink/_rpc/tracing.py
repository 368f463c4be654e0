"""W3C trace context (https://www.w3.org/TR/trace-context/) in a call's application-properties.

A request may carry ``traceparent`` (``version-traceid-parentid-flags``) and ``tracestate``
as application-properties, as AMQP stacks and OpenTelemetry's messaging conventions put them.
The server continues the caller's trace for the call: a new span id of its own, the caller's
trace id, flags and state; while its handler runs that trace is current (:func:`current_trace`),
so the calls it makes (``remote()``) carry the same trace id with the handler's span as their
parent. A client adds the headers only when a trace is current: no trace, no header, no cost.
A malformed ``traceparent`` is ignored, as the specification says (the call is served untraced).

With OpenTelemetry installed and a tracer provider set by the application, calls are spans as
well (:mod:`pairlink._rpc.spans`); the plain propagation here works without it.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from contextvars import ContextVar, Token
from typing import Protocol

import attrs

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_HEX = frozenset("0123456789abcdef")
_MAX_STATE = 512  # what a vendor must propagate at least: longer lists may be cut (spec 3.3.1.5)


@attrs.frozen(slots=True)
class TraceContext:
    """A position in a trace: ``trace_id`` (32 lowercase hex digits), the current span's
    ``span_id`` (16), its ``flags`` (bit 0: sampled) and the vendors' ``state`` (tracestate)."""

    trace_id: str
    span_id: str
    flags: int = 1
    state: str | None = None

    @classmethod
    def new(cls, *, sampled: bool = True) -> TraceContext:
        """The root of a new trace."""
        return cls(_random_hex(16), _random_hex(8), int(sampled))

    def child(self) -> TraceContext:
        """A new span of the same trace (a server's span for the caller's call)."""
        return attrs.evolve(self, span_id=_random_hex(8))

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    def headers(self) -> dict[str, str]:
        """The application-properties that carry this context to the callee."""
        if self.state:
            return {TRACEPARENT: self.traceparent, TRACESTATE: self.state}
        return {TRACEPARENT: self.traceparent}


def _random_hex(size: int) -> str:
    while True:  # all zeros is invalid (the spec's "no id")
        value = secrets.token_hex(size)
        if value.strip("0"):
            return value


def _is_hex(text: str, size: int) -> bool:
    return len(text) == size and _HEX.issuperset(text) and bool(text.strip("0"))


def parse_traceparent(value: object, state: object = None) -> TraceContext | None:
    """The caller's context from a ``traceparent`` (and ``tracestate``), or None if it is not
    valid (then both are ignored). A later version is read by its version-00 prefix."""
    if not isinstance(value, str) or len(value) < 55:
        return None
    version = value[:2]
    if not _HEX.issuperset(version) or version == "ff":
        return None
    if (version == "00" and len(value) != 55) or (len(value) > 55 and value[55] != "-"):
        return None
    if value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    trace_id, span_id, flags = value[3:35], value[36:52], value[53:55]
    if not (_is_hex(trace_id, 32) and _is_hex(span_id, 16) and _HEX.issuperset(flags)):
        return None
    if not isinstance(state, str) or not state.strip() or len(state) > _MAX_STATE:
        state = None
    return TraceContext(trace_id, span_id, int(flags, 16), state)


def continued(properties: Mapping[str, object]) -> TraceContext | None:
    """The server's span for a request that carries a valid ``traceparent``, else None."""
    caller = parse_traceparent(properties.get(TRACEPARENT), properties.get(TRACESTATE))
    return None if caller is None else caller.child()


class TraceScope(Protocol):
    """A served call's trace while it runs (:class:`use_trace`, or an OpenTelemetry span),
    finished with the reply's status."""

    def __enter__(self) -> object: ...
    def __exit__(self, *exc: object) -> None: ...
    def finish(self, status: int | None, rows: Sequence[int] = ()) -> None: ...


_current: ContextVar[TraceContext | None] = ContextVar("pairlink_trace", default=None)


def current_trace() -> TraceContext | None:
    """The trace the running code is part of: the call a handler serves, or what
    :class:`use_trace` made current; None when there is none."""
    return _current.get()


class use_trace:  # lower case: used like a function, `with use_trace(ctx):`
    """Make ``context`` the current trace while the block runs (restored afterwards): calls
    made in it carry it. ``use_trace()`` starts a new trace (``TraceContext.new()``)."""

    __slots__ = ("_token", "context")

    def __init__(self, context: TraceContext | None = None) -> None:
        self.context = TraceContext.new() if context is None else context

    def __enter__(self) -> TraceContext:
        self._token: Token[TraceContext | None] = _current.set(self.context)
        return self.context

    def __exit__(self, *_exc: object) -> None:
        _current.reset(self._token)

    def finish(self, status: int | None, rows: Sequence[int] = ()) -> None:
        """Nothing to record (the OpenTelemetry span of :mod:`pairlink._rpc.otel` does)."""


def outgoing() -> dict[str, str] | None:
    """The headers a request made now carries: the current trace's, or None."""
    context = _current.get()
    return None if context is None else context.headers()
