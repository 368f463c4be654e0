"""The links that carry a client's calls: one pair per address on a connection, and the calls in
flight on it, correlated by message-id (or by a request's own correlation-id). A call and a
message-level request (``Client.request``) share one exchange: credit, deadline, matching.

A pair is a paired link (LP-3) when the peer offered pairing, else a sender plus a receiver with
a dynamic source (one more round trip per address). It owns its reply link's end and watches
its request sender (:mod:`pairlink._io.links`); a detach or a lost connection of either half
ends the pair and fails its calls at once.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Awaitable
from typing import Any, Protocol

import attrs
import trio

from pairlink._amqp import errors as conditions
from pairlink._amqp.errors import DecodeError
from pairlink._amqp.link import Delivery
from pairlink._amqp.messaging import (
    Accepted,
    DeliveryState,
    Error,
    Header,
    Message,
    MessageId,
    Properties,
    Rejected,
    Source,
    Target,
)
from pairlink._amqp.performatives import ROLE_RECEIVER, ROLE_SENDER, SND_SETTLED, SND_UNSETTLED
from pairlink._amqp.types import Decoded
from pairlink._client.placement import room
from pairlink._client.reply import Reply
from pairlink._client.timeouts import Timeouts
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import LinkEnd, LinkOwner, Sender, attach
from pairlink._rpc import deadline, spans, tracing, wire
from pairlink._rpc.linkpair import paired_mismatch, paired_properties, unknown_address
from pairlink._rpc.payload import Encoding
from pairlink._telemetry.logs import Logger
from pairlink.errors import ConnectionLostError, LinkDetachedError, PairlinkError


class NotSent(Exception):
    """A call on a pair of one of several replicas failed before its request left (it waited
    in the line for credit): nothing reached the service, so another replica may take it.
    Raised only on a ``resendable`` pair; ``error`` is what its caller gets if none can."""

    def __init__(self, error: PairlinkError) -> None:
        super().__init__(str(error))
        self.error = error


class Calls(Protocol):
    """What pairs share across a client's connections (the :class:`pairlink.Client`)."""

    timeouts: Timeouts
    late_replies: int
    clock: trio.abc.Clock

    def next_id(self) -> int:
        """A message-id for a call that has none of its own."""
        ...


@attrs.define(eq=False)
class Call:
    """One call in flight: its request, then its reply or the error that ended it early.

    Its caller waits once (``wait``), whether the request left at once or waits in the
    sender's line for credit (:meth:`Sender.send_or_queue`, which sends ``payload`` and says
    so through ``sent``). It is woken by the reply, an error, or the client's ``Timeouts`` when
    ``deadline`` (Trio clock) passes: no cancel scope, no event. An unsettled request, whose
    outcome the caller awaits too, waits under ``scope`` instead."""

    deadline: float
    payload: bytes = b""
    quick: bool = False  # a call() (not a request()): its reply may be read that way
    scope: trio.CancelScope | None = None
    reply: Message | None = None
    value: Decoded = None  # the reply's value, read without the message (``valued``)
    valued: bool = False  # answered by ``wire.REPLY``: a call() that wants the value only
    error: PairlinkError | None = None
    line: Sender | None = None  # the sender whose line it waits in, not sent yet
    over: bool = False  # answered, failed or expired: its caller is woken (or need not wait)
    unsent: bool = False  # failed while waiting in the line: the request never left
    task: trio.lowlevel.Task | None = None  # the caller, while it waits

    def wait(self) -> Awaitable[None]:
        """What its caller awaits, at once: Trio's own wait (a coroutine of ours around it
        would cost every call a frame and its resumptions)."""
        if self.over:
            return trio.lowlevel.checkpoint()  # noqa: ASYNC105 - the caller awaits it
        self.task = trio.lowlevel.current_task()
        return trio.lowlevel.wait_task_rescheduled(self._abort)  # noqa: ASYNC105 - as above

    def _abort(self, _raise_cancel: object) -> trio.lowlevel.Abort:
        self.task = None  # cancelled: nothing wakes it any more
        self.leave_line()
        return trio.lowlevel.Abort.SUCCEEDED

    def leave_line(self) -> None:
        """A request whose caller is done with it (cancelled, timed out, failed) never
        leaves: out of the line at once, before a flow that comes meanwhile could send it."""
        line, self.line = self.line, None
        if line is not None:
            line.withdraw(self)

    def _wake(self) -> None:
        self.over = True
        if self.line is not None:
            self.leave_line()
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def answer(self, reply: Message) -> None:
        self.reply = reply
        self._wake()

    def answer_value(self, value: Decoded) -> None:
        self.value, self.valued = value, True
        self._wake()

    def expire(self) -> None:
        self._wake()

    def end(self, error: PairlinkError) -> None:
        self.error = error
        if self.line is not None:
            self.unsent = True
        self._wake()
        if self.scope is not None:
            self.scope.cancel()

    def sent(self, error: PairlinkError | None) -> None:
        """From the sender's line: the request went out, or never will (``error``)."""
        self.line = None
        if error is not None:
            self.unsent = True
            self.end(error)


class CallPair(LinkOwner):
    """The links that carry calls to one address on one connection: a paired link (LP-3) when
    the peer offered pairing, else a sender and a dynamic reply receiver.

    It owns the reply link's end and watches the request :class:`Sender`: a detach or a lost
    connection of either half ends the whole pair. Replies are handed to their callers in the
    connection's reader task, instead of queueing for a consumer task: one task switch less
    per call, and reply credit is granted again at once (one flow frame per half of it)."""

    sender: Sender
    replies: LinkEnd

    def __init__(self, conn: CallConnection, address: str, *, paired: bool) -> None:
        self.conn = conn
        self.address = address
        self.paired = paired
        self.calls: dict[MessageId, Call] = {}
        self.ready = trio.Event()  # reply_to is known (at once on a pair)
        self.reply_to = wire.ME
        self.error: PairlinkError | None = None
        self.fresh = paired  # the first request may go before the peer's attach (LP-10)
        self.granted = False  # the service has given the request link credit
        self.verified = not paired  # LP-5 applies to pairs only
        self.resendable = False  # a call that never left raises NotSent: another replica takes it
        self.log = conn.log
        self.clock = conn.client.clock
        self.tracer = spans.opentelemetry_tracer()  # None: no spans, plain W3C headers

    # -- set-up ----------------------------------------------------------------------------

    def attach(self, settled: bool, credit: int) -> None:
        """Queue both attaches and the reply credit; nothing is awaited, so the first request
        queued right after leaves in the same write (LP-10)."""
        amqp = self.conn.amqp
        session = amqp.session
        mode = SND_SETTLED if settled else SND_UNSETTLED
        if self.paired:
            name = amqp.link_name("pair")
            local = name  # our end's address: unique on this connection, as the pair's name
            properties = paired_properties()
            request_source, reply_source = Source(address=local), Source(address=self.address)
            reply_target = Target(address=local)
            names = (name, name)
        else:
            properties = None
            request_source, reply_source = Source(), Source(dynamic=True)
            reply_target = Target()
            names = (amqp.link_name("requests"), amqp.link_name("replies"))
        self.log = self.conn.log.bind(link=names[0], address=self.address)
        self.sender = Sender(watcher=self)
        self.sender.end = attach(
            amqp,
            self.sender,
            session=session,
            name=names[0],
            role=ROLE_SENDER,
            source=request_source,
            target=Target(address=self.address),
            snd_settle_mode=mode,
            properties=properties,
        )
        self.replies = attach(
            amqp,
            self,
            session=session,
            name=names[1],
            role=ROLE_RECEIVER,
            source=reply_source,
            target=reply_target,
            snd_settle_mode=mode,
            properties=properties,
        )
        self.reply_credit = credit
        amqp.flow(self.replies.link, credit)  # before any transfer: the reply credit first
        self.log.debug("pair.attach", paired=self.paired)
        if self.paired:
            self.ready.set()

    async def wait_dynamic_address(self) -> None:
        """Classic pattern: the peer names the reply node in its answer to our dynamic
        receiver; requests can say ``reply-to`` only once it did."""
        await self.replies.attached.wait()
        source = self.replies.link.remote_source
        if self.error is None and (source is None or not source.address):
            self.lost(LinkDetachedError("the peer created no dynamic reply address"))
        if self.error is not None:
            raise self.error
        assert source is not None and source.address is not None
        self.reply_to = str(source.address)
        self.log.debug("pair.dynamic", reply_to=self.reply_to)
        self.ready.set()

    async def watch(self) -> None:
        """LP-5 for a pair that gets no reply yet: check the peer's attaches when they come."""
        await self.sender.attached.wait()
        await self.replies.attached.wait()
        self.check_answer()

    def check_answer(self) -> None:
        """LP-5: the peer's attach for each half must say ``paired: true`` as ours did; if it
        does not, detach at once with ``precondition-failed``. A null terminus is a refusal
        (§2.6.3) whose detach says why: that is the error the calls get, not this check's."""
        if self.verified or self.error is not None:
            return
        answers = (
            (self.sender.link, self.sender.link.remote_target),
            (self.replies.link, self.replies.link.remote_source),
        )
        for link, terminus in answers:
            if link.remote_attach is None or terminus is None:
                return
        self.verified = True
        for link, _ in answers:
            if paired_mismatch(link.properties, link.remote_properties):
                description = (
                    f"the peer answered the paired attach {link.name!r} for {self.address!r} "
                    f"with properties {link.remote_properties!r}, not paired: true (LP-5)"
                )
                error = Error(condition=conditions.PRECONDITION_FAILED, description=description)
                self.log.warning("pair.lp5_mismatch", remote=link.remote_properties)
                self.lost(LinkDetachedError.from_amqp(error, description), detach_with=error)
                return

    # -- calls -----------------------------------------------------------------------------

    async def call(
        self,
        operation: str,
        args: tuple[object, ...],
        kwargs: dict[str, object],
        deadline_at: float,
        encoding: Encoding | None,
        settled: bool,
        message_id: str | None,
        now: float,
    ) -> Any:
        """Send one request and wait for its reply until ``deadline_at`` (Trio clock), its ttl
        counted from ``now`` (Trio clock: the caller's reading); its body in ``encoding``,
        else in the one the connection's peer reads (``peer_encoding``). It carries its
        message-id as its correlation-id too: a server may copy either, and the current trace
        (:mod:`pairlink._rpc.tracing`), if any, in a span of its own when OpenTelemetry is
        set up."""
        call_id = self._new_id(message_id)
        tracer = self.tracer
        if tracer is None:  # no span, so no context manager either
            message = self._encode_call(
                call_id, operation, args, kwargs, deadline_at, now, encoding, tracing.outgoing()
            )
            return _result(
                *await self.exchange(call_id, message, deadline_at, settled, operation, quick=True)
            )
        with spans.client_span(tracer, self.address, operation) as headers:
            message = self._encode_call(
                call_id, operation, args, kwargs, deadline_at, now, encoding, headers
            )
            return _result(
                *await self.exchange(call_id, message, deadline_at, settled, operation, quick=True)
            )

    def _encode_call(
        self,
        call_id: MessageId,
        operation: str,
        args: tuple[object, ...],
        kwargs: dict[str, object],
        deadline_at: float,
        now: float,
        encoding: Encoding | None,
        headers: dict[str, str] | None,
    ) -> bytes:
        """A call's request, its ttl what is left at ``now`` (Trio clock) of ``deadline_at``."""
        return wire.encode_request(
            operation,
            args,
            kwargs,
            message_id=call_id,
            now=deadline.wall_time(),
            timeout=None if deadline_at == math.inf else deadline_at - now,
            reply_to=self.reply_to,
            encoding=encoding or self.conn.encoding,
            headers=headers,
        )

    async def request(
        self, message: Message, deadline_at: float, settled: bool, label: str
    ) -> Reply:
        """Send a message of the caller's making and wait for its reply as ``call`` does,
        with nothing interpreted. Filled in here, unless the message has its own: the
        message-id, the correlation-id (the message-id, as a call's), the deadline and the
        current trace (a ``traceparent`` of the caller's own is never replaced); and always
        the ``reply-to`` of this pair."""
        app = message.application_properties
        if app is not None and tracing.TRACEPARENT in app:
            return await self._request(message, deadline_at, settled, label, None)
        tracer = self.tracer
        if tracer is None:
            return await self._request(message, deadline_at, settled, label, tracing.outgoing())
        with spans.client_span(tracer, self.address, label) as headers:
            return await self._request(message, deadline_at, settled, label, headers)

    async def _request(
        self,
        message: Message,
        deadline_at: float,
        settled: bool,
        label: str,
        headers: dict[str, str] | None,
    ) -> Reply:
        if headers:
            message = attrs.evolve(
                message,
                application_properties={**(message.application_properties or {}), **headers},
            )
        props = message.properties or Properties()
        call_id = self._new_id(props.message_id)
        alias = props.correlation_id
        if alias is None or alias == call_id:
            alias = None
        elif alias in self.calls:
            raise ValueError(f"correlation_id {alias!r} is already in flight on {self.address}")
        props = copy.copy(props)  # as given, should it be sent again on a new pair (LP-10)
        props.message_id, props.reply_to = call_id, self.reply_to
        if alias is None:
            props.correlation_id = call_id
        header = message.header
        has_ttl = header is not None and header.ttl is not None
        if not (has_ttl or props.absolute_expiry_time is not None or math.isinf(deadline_at)):
            header = Header() if header is None else copy.copy(header)
            remaining = deadline_at - trio.current_time()
            header.ttl, props.absolute_expiry_time = wire.deadline_fields(
                deadline.wall_time(), remaining
            )
        payload = attrs.evolve(message, header=header, properties=props).encode()
        call, outcome = await self.exchange(call_id, payload, deadline_at, settled, label, alias)
        return Reply(call.reply, outcome)

    def free_credit(self) -> int:
        """Requests it may send now without waiting (below zero: that many wait in its line);
        a fresh pair may send one before the peer's attach (LP-10)."""
        sender = self.sender
        link = sender.end.link
        if self.fresh and link.remote_attach is None:
            return 1
        return link.usable_credit - sender.waiting

    def room(self) -> int:
        """What replicas are ranked by (:func:`pairlink._client.placement.room`)."""
        return room(self.free_credit(), len(self.calls))

    def had_no_room(self, error: LinkDetachedError) -> bool:
        """Whether a call failed with ``error`` because the service had no room for this
        pair's pipelined first requests (LP-10): detached before it granted any credit, so
        none reached the service and each may go again, on a new pair."""
        return not self.granted and error.condition == conditions.TRANSFER_LIMIT_EXCEEDED

    def _new_id(self, chosen: MessageId | None) -> MessageId:
        """A request's message-id: the caller's, else the client's counter."""
        if chosen is None:
            return self.conn.client.next_id()
        if chosen in self.calls:  # its reply could not be told from the other's
            raise ValueError(f"message_id {chosen!r} is already in flight on {self.address}")
        return chosen

    async def exchange(
        self,
        call_id: MessageId,
        payload: bytes,
        deadline_at: float,
        settled: bool,
        label: str,
        alias: MessageId | None = None,
        *,
        quick: bool = False,
    ) -> tuple[Call, DeliveryState | None]:
        """Send one request and wait until ``deadline_at`` (Trio clock) for the reply whose
        correlation-id is ``call_id`` (or ``alias``, the request's own correlation-id).

        Returns the answered call (its ``reply``, or for a ``quick`` one maybe only its
        ``value``) and the request's outcome (None when it went pre-settled). A request
        settled with any outcome but ``accepted`` was not taken: no reply will come, so it
        returns at once with none."""
        call = Call(deadline_at, payload, quick)
        calls = self.calls
        alone = not calls  # one call at a time: its request is written through, not batched
        calls[call_id] = call
        if alias is not None:
            calls[alias] = call
        presume, self.fresh = self.fresh, False
        outcome: DeliveryState | None = None
        try:
            if settled:  # the usual case: only the reply is waited for, under Timeouts
                if not self.sender.send_or_queue(call, presume_credit=presume, through=alone):
                    call.line = self.sender
                if math.isinf(deadline_at):
                    await call.wait()
                else:
                    timeouts = self.conn.client.timeouts
                    timeouts.add(call)
                    try:
                        await call.wait()
                    finally:
                        timeouts.discard(call)
            else:  # the request's outcome is awaited too: under a cancel scope
                call.scope = trio.CancelScope(deadline=deadline_at)
                with call.scope:
                    delivery = await self.sender.send(payload, presume_credit=presume)
                    outcome = delivery.remote_state
                    if outcome is None or isinstance(outcome, Accepted):
                        await call.wait()
        finally:
            calls.pop(call_id, None)
            if alias is not None:
                calls.pop(alias, None)
        if (
            call.valued
            or call.reply is not None
            or not (outcome is None or isinstance(outcome, Accepted))
        ):
            return call, outcome
        if call.error is not None:
            if call.unsent and self.resendable:
                raise NotSent(call.error)
            # one error ends every call of the pair: each raise starts its own traceback,
            # where re-raising the shared object would stack every caller's frames on it
            raise call.error.with_traceback(None)
        self.log.debug("call.timeout", message_id=call_id, operation=label)
        raise TimeoutError(f"{self.address}.{label}: no reply within the deadline")

    # -- link events (LinkOwner) -----------------------------------------------------------

    def link_flowed(self, end: LinkEnd) -> None:
        if end.link.link_credit and end is self.sender.end:
            self.granted = True

    def link_received(self, end: LinkEnd, delivery: Delivery, payload: bytes) -> None:
        quick = wire.REPLY.read(payload) if self.verified else None
        if quick is None or not self._answer_quick(*quick):
            end.conn.settle(delivery, self._read_reply(payload))
        elif not delivery.settled:  # the service asked for our receipt
            end.conn.settle(delivery, Accepted())
        if end.link.link_credit <= self.reply_credit // 2:
            end.conn.flow(end.link, self.reply_credit)

    def _answer_quick(self, correlation_id: Decoded, value: Decoded) -> bool:
        """The usual reply, read by ``wire.REPLY``: answer its call with the value, if it
        is a call() whose caller still waits; False leaves it to the general path."""
        call = self.calls.get(correlation_id)
        if call is None or not call.quick or self.clock.current_time() >= call.deadline:
            return False
        del self.calls[correlation_id]
        call.answer_value(value)
        return True

    def _read_reply(self, payload: bytes) -> Accepted | Rejected:
        """Any reply, through the whole message: its outcome, for the service."""
        try:
            message = Message.decode(payload)
        except DecodeError as exc:  # no correlation-id to read: its caller will time out
            self.log.warning("call.undecodable_reply", error=str(exc))
            return Rejected(error=Error(condition=conditions.DECODE_ERROR, description=str(exc)))
        self.on_reply(message)
        return Accepted()

    def link_ended(self, end: LinkEnd) -> None:
        error = end.detached
        if error is not None and error.condition == conditions.NOT_FOUND and not self.granted:
            error = self._not_found(error)
        self.lost(error)

    def _not_found(self, refusal: LinkDetachedError) -> LinkDetachedError:
        """A refused attach as one line naming the address and the (redacted) URL, where the
        peer's description alone names neither; what the peer said is kept if it differs."""
        said = refusal.description
        why = f"{unknown_address(self.address)} on {self.conn.where}"
        if said and said != unknown_address(self.address):
            why = f"{why} (the peer says: {said})"
        return LinkDetachedError(why, conditions.NOT_FOUND)

    def on_reply(self, message: Message) -> None:
        if not self.verified:
            self.check_answer()
            if self.error is not None:
                return
        props = message.properties
        correlation_id: Decoded = props.correlation_id if props is not None else None
        call = self.calls.pop(correlation_id, None)
        if call is not None and trio.current_time() >= call.deadline:
            call.expire()  # due, though Timeouts has not woken it yet: the deadline wins
            call = None
        if call is None:  # its caller timed out or was cancelled: nobody waits for it
            self.conn.client.late_replies += 1
            self.log.debug("call.late_reply", correlation_id=correlation_id)
            return
        call.answer(message)

    def lost(self, error: PairlinkError | None, *, detach_with: Error | None = None) -> None:
        """The pair is over (a half detached, the connection died, LP-5 failed): fail its
        calls now, forget it so the next call attaches a new one, detach what is left."""
        if self.error is not None:
            return
        amqp = self.conn.amqp
        if error is None or amqp.closed.is_set():
            error = amqp.error or ConnectionLostError("the connection is closed")
        self.error = error
        if self.conn.pairs.get(self.address) is self:
            del self.conn.pairs[self.address]
        if self.calls:
            self.log.info("pair.lost", in_flight=len(self.calls), error=str(error))
        for call in self.calls.values():
            call.end(error)
        self.ready.set()
        for end in (self.sender.end, self.replies):
            end.attached.set()  # ends watch()
            if not amqp.closed.is_set():
                end.detach(detach_with)


def _result(call: Call, outcome: DeliveryState | None) -> Any:
    """A call's value: its reply's, once the request's outcome says it was taken."""
    if outcome is not None:
        wire.raise_for_outcome(outcome)
    if call.valued:
        return call.value
    assert call.reply is not None  # accepted (or pre-settled), so it was answered
    return wire.parse_reply(call.reply)


@attrs.define(eq=False)
class CallConnection:
    """One live AMQP connection of a client and the pairs on it (one per address)."""

    client: Calls
    amqp: AmqpConnection
    paired: bool
    log: Logger
    where: str
    """The URL it was opened to, as errors show it (``net.redacted``)."""
    pairs: dict[str, CallPair] = attrs.field(factory=dict)
    encoding: Encoding = Encoding.AMQP_VALUE
    """The request body its peer reads (``wire.peer_encoding``), for calls that name none."""

    @property
    def alive(self) -> bool:
        # an error comes first: the engine is done with it before the socket is closed
        return self.amqp.error is None and not self.amqp.closed.is_set()
