"""The context of the call a handler serves: who called, from where, until when, with what;
and the middleware that runs around handlers.

The actor sets one ContextVar per call around the handler (:class:`handling`) holding the call
itself; :func:`current_call` builds the :class:`CallContext` only when a handler asks, so calls
whose handlers never look cost one ``set``/``reset`` and nothing more. A ``def`` handler run in
a worker thread sees it too: set there (in a copy of the actor's context), or, with middleware,
in the copy of the worker task's context that the thread runs in.
The call's trace (:mod:`pairlink._rpc.tracing`), when it has one, is made current with it.

Middleware is what gRPC calls interceptors and Nameko dependency providers: an async callable
``mw(call, proceed)`` around every call of a service, that may look at the context, refuse
(raise ``CallError``), time, log, or change the value ``await proceed()`` returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar, Token
from typing import Any, Protocol

import attrs

from pairlink._amqp.messaging import MessageId
from pairlink._amqp.types import Decoded
from pairlink._rpc.tracing import TraceScope


@attrs.frozen(slots=True)
class CallContext:
    """What a handler may know about its call, and the one thing it may add to its reply.

    ``reply_properties`` is the only mutable part: its entries go into the reply's
    application-properties (keys strings, values AMQP simple types), beside the status, which
    they never override.
    """

    message_id: MessageId | None
    # who called: their SASL user, also behind gateways this server trusts to vouch for their
    # callers (``vouching_users``); None: they did not authenticate
    user: str | None
    container_id: str | None  # the container-id of the caller's connection (its open)
    peer: str  # the caller's network address
    deadline: float | None  # wall-clock seconds since the epoch, as pairlink._rpc.deadline
    application_properties: Mapping[str, Decoded]  # the request's, read-only
    service: str  # the address of the service called (as this server serves it)
    operation: str  # the operation called
    # the SASL users of the gateways that vouched for ``user``, the caller's side first; the
    # last is this connection's (empty: ``user`` called directly)
    via: tuple[str, ...] = ()
    reply_properties: dict[str, object] = attrs.field(factory=dict)


Proceed = Callable[[], Awaitable[Any]]
"""What a middleware awaits to run the rest of the chain and the handler: it gives the value."""
Middleware = Callable[[CallContext, Proceed], Awaitable[Any]]
"""``async def mw(call: CallContext, proceed: Proceed) -> Any``: runs around each call."""


def check_middleware(where: str, middleware: Sequence[Middleware]) -> tuple[Middleware, ...]:
    """``middleware`` as a tuple; ``TypeError`` naming ``where`` for an item that is not
    callable, so a mistake shows when the service is declared, not at its first call."""
    if not isinstance(middleware, list | tuple):
        raise TypeError(f"{where}: middleware takes a list of async callables")
    for item in middleware:
        if not callable(item):
            raise TypeError(
                f"{where}: middleware must be async callables (call, proceed), not {item!r}"
            )
    return tuple(middleware)


def through(
    middleware: Sequence[Middleware], call: CallContext, handler: Proceed
) -> Awaitable[Any]:
    """``handler`` run inside ``middleware``, the first outermost."""
    last = len(middleware)

    def step(i: int) -> Awaitable[Any]:
        if i == last:
            return handler()
        return middleware[i](call, lambda: step(i + 1))

    return step(0)


class CallSource(Protocol):
    """What the ContextVar holds (the actor's call): builds its context once, on demand."""

    trace_scope: TraceScope | None

    def call_context(self) -> CallContext: ...


_current: ContextVar[CallSource | None] = ContextVar("pairlink_call", default=None)


def current_call() -> CallContext:
    """The context of the call the running handler serves (the same object for the whole call).

    Raises ``LookupError`` outside a handler: code that may run either way asks
    :func:`in_call` first.
    """
    source = _current.get()
    if source is None:
        raise LookupError("current_call() is only available while a handler serves a call")
    return source.call_context()


def in_call() -> bool:
    """Whether the running code serves a call (so :func:`current_call` would answer)."""
    return _current.get() is not None


class handling:  # lower case: used like a function, `with handling(call):`
    """Make ``call`` the current call while the block runs (restored afterwards). A class, as
    ``pairlink._rpc.deadline.serving``: it is entered once per call served."""

    __slots__ = ("_source", "_token")

    def __init__(self, source: CallSource) -> None:
        self._source = source

    def __enter__(self) -> None:
        source = self._source
        self._token: Token[CallSource | None] = _current.set(source)
        if source.trace_scope is not None:
            source.trace_scope.__enter__()

    def __exit__(self, *_exc: object) -> None:
        scope = self._source.trace_scope
        if scope is not None:
            scope.__exit__()
        _current.reset(self._token)
