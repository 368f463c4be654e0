"""A call as the actor holds it, what it is answered with, and the protocols of where it comes
from and where its reply goes (:mod:`pairlink._server.container` implements both;
:mod:`pairlink._server.actor` uses them).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Protocol

import attrs

from pairlink._amqp.link import Delivery, Link
from pairlink._amqp.messaging import DeliveryState, Message, Properties
from pairlink._io.links import LinkEnd
from pairlink._rpc.caller import Identity
from pairlink._rpc.payload import Encoding
from pairlink._rpc.tracing import TraceScope
from pairlink._rpc.wire import Request
from pairlink._server.context import CallContext
from pairlink._server.mailbox import CreditedLink
from pairlink._server.service import Operation


class Origin(CreditedLink, Protocol):
    """Where calls come from, as the actor sees it (:class:`pairlink._server.container.
    RequestLink`): the mailbox's view, plus who calls on it, outcomes and reply routing
    (LP-8)."""

    caller: Identity  # judged on its attach (pairlink._rpc.caller)

    @property
    def end(self) -> LinkEnd: ...
    def release(self) -> None: ...
    def set_outcome(self, delivery: Delivery, state: DeliveryState) -> None: ...
    def route_for(self, reply_to: object) -> Route | None: ...
    def why_unroutable(self, reply_to: object) -> tuple[str, str]: ...


def log_ids(origin: Origin, message_id: object) -> dict[str, object]:
    """What ties a log line to its call: its connection, request link and message-id."""
    return {"conn": origin.end.conn.id, "link": origin.link.name, "message_id": message_id}


class Route(Protocol):
    """Where replies go, as the actor sees it (:class:`pairlink._server.container.ReplyLink`)."""

    to: str | None

    @property
    def usable(self) -> bool: ...
    @property
    def link(self) -> Link: ...
    def deliver(
        self, payload: bytes, origin: Origin, request_settled: bool, through: bool = False
    ) -> None: ...


class CallObserver(Protocol):
    """Told of each request's arrival and of its answer's status-code, and of the rows'
    results of each batch answered (the server's metrics,
    :class:`pairlink._server.metrics.CallMetrics`)."""

    def arrived(self, delivery: Delivery) -> None: ...
    def answered(self, delivery: Delivery, operation: str, status: int) -> None: ...
    def rows(self, operation: str, results: list[list[object]]) -> None: ...


DedupKey = tuple[Identity, str]
"""How a service's dedup store knows a call: who called (its SASL user, or the caller a trusted
gateway vouched for, with the gateways it came through) and the message-id it gave the call
(:mod:`pairlink._server.dedup`)."""


@attrs.define(slots=True)
class Answer:
    """What a call is answered with: the actor answers every request through one, and the
    dedup store keeps one to answer a repeat the same way."""

    status: int
    description: str
    value: object = None  # the handler's result, for a 200
    error_type: str | None = None  # the exception type the service discloses
    ref: str | None = None  # the log's reference id of an undisclosed failure
    reply_properties: dict[str, object] | None = None  # the application-properties its handler set


@attrs.define(slots=True, eq=False)
class Arrival:
    """A request that arrived: what it asks, where its reply goes, the link it came on (whose
    mailbox slot it holds until answered) and its delivery (to settle)."""

    request: Request
    route: Route
    origin: Origin
    delivery: Delivery


@attrs.define(slots=True, eq=False)
class Call(Arrival):
    """A checked call waiting in the mailbox (or running)."""

    operation: Operation
    args: list[Any]
    kwargs: dict[str, Any]
    service: str  # its address, as this server serves it
    key: DedupKey | None = None  # its caller and message-id, while the running copy of one
    context: CallContext | None = None  # built when its handler first asks (current_call)
    trace_scope: TraceScope | None = None  # its trace, when traced (pairlink._rpc.tracing)
    replay: Answer | None = None  # a repeat's kept answer: given if its middleware lets it
    batched: bool = False  # a batch (pairlink._rpc.batch): its args are its rows
    weight: int = 0  # the mailbox slots it holds beside its own, while unanswered (a batch's)

    def call_context(self) -> CallContext:
        """The handler's view of this call, built once, on demand: most handlers never ask."""
        if self.context is None:
            conn = self.origin.end.conn
            opened = conn.remote_open
            request = self.request
            caller = self.origin.caller
            self.context = CallContext(
                message_id=request.message_id,
                user=caller.user,
                via=caller.via,
                container_id=None if opened is None else opened.container_id,
                peer=conn.peer,
                deadline=request.deadline,
                application_properties=MappingProxyType(request.application_properties),
                service=self.service,
                operation=self.operation.name,
            )
        return self.context


def bare_request(message: Message) -> Request:
    """Just enough of an unparseable request to address an error reply to it."""
    props = message.properties or Properties()
    reply_to = None if props.reply_to is None else str(props.reply_to)
    return Request(
        "",
        [],
        {},
        props.message_id,
        reply_to,
        Encoding.AMQP_VALUE,
        None,
        message,
        props.correlation_id,
    )
