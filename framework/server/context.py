"""The context of the call a handler serves: who called, from where, until when, with what.

The actor sets one ContextVar per call around the handler (:class:`handling`) holding the call
itself; :func:`current_call` builds the :class:`CallContext` only when a handler asks, so calls
whose handlers never look cost one ``set``/``reset`` and nothing more. A ``def`` handler run in
a worker thread sees it too: ``trio.to_thread.run_sync`` runs it in a copy of the task's context.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar, Token
from typing import Any, Protocol

import attrs


@attrs.frozen(slots=True)
class CallContext:
    """What a handler may know about its call, and the one thing it may add to its reply.

    ``reply_properties`` is the only mutable part: its entries go into the reply's
    application-properties (keys strings, values AMQP simple types), beside the status, which
    they never override.
    """

    message_id: Any
    user: str | None  # the caller's SASL identity; None: it did not authenticate
    container_id: str | None  # the container-id of the caller's connection (its open)
    peer: str  # the caller's network address
    deadline: float | None  # wall-clock seconds since the epoch, as framework.rpc.deadline
    application_properties: Mapping[str, Any]  # the request's, read-only
    reply_properties: dict[str, Any] = attrs.field(factory=dict)


class CallSource(Protocol):
    """What the ContextVar holds (the actor's call): builds its context once, on demand."""

    def call_context(self) -> CallContext: ...


_current: ContextVar[CallSource | None] = ContextVar("pairlink_call", default=None)


def current_call() -> CallContext:
    """The context of the call the running handler serves (the same object for the whole call).

    Raises ``LookupError`` outside a handler: code that may run either way asks
    ``framework.server.context.in_call()`` first.
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
    ``framework.rpc.deadline.serving``: it is entered once per call served."""

    __slots__ = ("_source", "_token")

    def __init__(self, source: CallSource) -> None:
        self._source = source

    def __enter__(self) -> None:
        self._token: Token[CallSource | None] = _current.set(self._source)

    def __exit__(self, *_exc: object) -> None:
        _current.reset(self._token)
