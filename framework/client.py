"""The client: calls to services over paired links, pipelined, correlated, with deadlines.

``connect(url)`` opens one connection that any number of tasks share. The only round trip
before the first call is the peer's ``open`` (with its answer to the session we begin in the
same write): it says whether the peer offers ``LINK_PAIR_V1_0`` (LP-2). If it does, the first
call on an address sends attach (sender), attach (receiver), flow (reply credit) and the
request in one burst (LP-10); every later call on that address reuses the pair. If it does
not, the client falls back to the classic pattern (a sender plus a receiver with a dynamic
source, ``reply-to`` = the address the peer created), which costs one more round trip per
address.

Replies are matched to calls by ``correlation-id`` = the request's ``message-id`` (a counter,
or a string the caller chose: a stable key that a deduplicating service recognises when the
call is sent again), so many calls share one pair and may complete in any order. Every failure
ends the calls it concerns at once: a detached or refused pair fails its calls with
``LinkDetachedError``, a lost connection fails every call in flight with
``ConnectionLostError``; a timeout raises ``TimeoutError`` and the reply, if it comes later,
is dropped.
"""

from __future__ import annotations

import functools
import itertools
import math
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import structlog
import trio

from framework import deadline, net, transport, wire
from framework.amqp import errors as conditions
from framework.amqp.errors import DecodeError
from framework.amqp.link import Delivery, Link
from framework.amqp.messaging import Accepted, Error, Message, Rejected, Source, Target
from framework.amqp.performatives import ROLE_RECEIVER, ROLE_SENDER, SND_SETTLED, SND_UNSETTLED
from framework.amqp.session import Session, SessionState
from framework.backoff import jittered_backoff
from framework.endpoints import Receiver, Sender
from framework.errors import (
    AuthenticationError,
    ConnectionLostError,
    LinkDetachedError,
    PairlinkError,
)
from framework.linkpair import LINK_PAIR_V1_0, offers_pairing, paired_mismatch, paired_properties
from framework.payload import Encoding
from framework.taskgroups import body_errors_unwrapped
from framework.timeouts import Timeouts

log = structlog.get_logger("pairlink.client")


@attrs.define(eq=False)
class _Call:
    """One call in flight: its reply, or the error that ended it early. Until ``deadline``
    (Trio clock) it waits under ``scope`` while its request may still wait to leave, then on
    ``done`` alone, woken by the client's ``Timeouts`` when the deadline passes."""

    deadline: float
    scope: trio.CancelScope | None = None
    done: trio.Event = attrs.field(factory=trio.Event)
    reply: Message | None = None
    error: PairlinkError | None = None

    def expire(self) -> None:
        self.done.set()

    def end(self, error: PairlinkError) -> None:
        self.error = error
        self.done.set()
        if self.scope is not None:
            self.scope.cancel()


class _RequestSender(Sender):
    """The request half: a detach or a lost connection ends the whole pair."""

    def __init__(self, conn: transport.AmqpConnection, link: Link, pair: _Pair) -> None:
        super().__init__(conn, link)
        self.pair = pair

    def on_flow(self) -> None:
        super().on_flow()
        if self.link.link_credit:
            self.pair.granted = True

    def on_ended(self) -> None:
        super().on_ended()
        self.pair.lost(self.detached)


class _ReplyReceiver(Receiver):
    """The reply half. Replies are handed to their callers right here, in the connection's
    reader task, instead of queueing for a consumer task: one task switch less per call, and
    credit can be granted again at once (in batches: one flow frame per half the credit)."""

    def __init__(
        self, conn: transport.AmqpConnection, link: Link, credit: int, pair: _Pair
    ) -> None:
        super().__init__(conn, link, credit)
        self.pair = pair

    def on_message(self, delivery: Delivery, payload: bytes) -> None:
        try:
            message = Message.decode(payload)
        except DecodeError as exc:  # no correlation-id to read: its caller will time out
            self.pair.log.warning("call.undecodable_reply", error=str(exc))
            outcome: Accepted | Rejected = Rejected(
                error=Error(condition=conditions.DECODE_ERROR, description=str(exc))
            )
        else:
            self.pair.on_reply(message)
            outcome = Accepted()
        self.conn.settle(delivery, outcome)  # when the service asked for our receipt
        if self.link.link_credit <= self.credit // 2:
            self.grant()

    def on_ended(self) -> None:
        super().on_ended()
        self.pair.lost(self.detached)


class _Pair:
    """The links that carry calls to one address on one connection: a paired link (LP-3) when
    the peer offered pairing, else a sender and a dynamic reply receiver."""

    sender: _RequestSender
    receiver: _ReplyReceiver

    def __init__(self, conn: _Connection, address: str, *, paired: bool) -> None:
        self.conn = conn
        self.address = address
        self.paired = paired
        self.calls: dict[Any, _Call] = {}
        self.ready = trio.Event()  # reply_to is known (at once on a pair)
        self.reply_to = wire.ME
        self.error: PairlinkError | None = None
        self.fresh = paired  # the first request may go before the peer's attach (LP-10)
        self.granted = False  # the service has given the request link credit
        self.verified = not paired  # LP-5 applies to pairs only
        self.log = conn.log

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
        request_link = amqp.attach(
            session=session,
            name=names[0],
            role=ROLE_SENDER,
            source=request_source,
            target=Target(address=self.address),
            snd_settle_mode=mode,
            properties=properties,
        )
        reply_link = amqp.attach(
            session=session,
            name=names[1],
            role=ROLE_RECEIVER,
            source=reply_source,
            target=reply_target,
            snd_settle_mode=mode,
            properties=properties,
        )
        self.sender = _RequestSender(amqp, request_link, self)
        self.receiver = _ReplyReceiver(amqp, reply_link, credit, self)
        self.receiver.grant()  # flow before any transfer: the reply credit comes first
        self.log.debug("pair.attach", paired=self.paired)
        if self.paired:
            self.ready.set()

    async def wait_dynamic_address(self) -> None:
        """Classic pattern: the peer names the reply node in its answer to our dynamic
        receiver; requests can say ``reply-to`` only once it did."""
        await self.receiver.attached.wait()
        source = self.receiver.link.remote_source
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
        await self.receiver.attached.wait()
        self.check_answer()

    def check_answer(self) -> None:
        """LP-5: the peer's attach for each half must say ``paired: true`` as ours did; if it
        does not, detach at once with ``precondition-failed``. A null terminus is a refusal
        (§2.6.3) whose detach says why: that is the error the calls get, not this check's."""
        if self.verified or self.error is not None:
            return
        answers = (
            (self.sender.link, self.sender.link.remote_target),
            (self.receiver.link, self.receiver.link.remote_source),
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
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        deadline_at: float,
        encoding: Encoding,
        settled: bool,
        message_id: str | None,
    ) -> Any:
        """Send one request and wait for its reply until ``deadline_at`` (Trio clock)."""
        client = self.conn.client
        call_id: int | str
        if message_id is None:
            call_id = next(client._ids)
        elif message_id in self.calls:  # its reply could not be told from the other's
            raise ValueError(f"message_id {message_id!r} is already in flight on {self.address}")
        else:
            call_id = message_id
        remaining = None if math.isinf(deadline_at) else deadline_at - trio.current_time()
        message = wire.encode_request(
            operation,
            args,
            kwargs,
            message_id=call_id,
            now=time.time(),
            timeout=remaining,
            reply_to=self.reply_to,
            encoding=encoding,
        )
        call = _Call(deadline_at)
        self.calls[call_id] = call
        presume, self.fresh = self.fresh, False
        try:
            if settled and self.sender.has_credit(presume):
                await self._send_then_wait(call, message, presume)
            else:  # the request may wait for credit (or its outcome): under a cancel scope
                call.scope = trio.CancelScope(deadline=deadline_at)
                with call.scope:
                    delivery = await self.sender.send(
                        message, wait=not settled, presume_credit=presume
                    )
                    if not settled:
                        wire.raise_for_outcome(delivery.remote_state)
                    await call.done.wait()
        finally:
            self.calls.pop(call_id, None)
        if call.reply is not None:
            return wire.parse_reply(call.reply)
        if call.error is not None:
            raise call.error
        self.log.debug("call.timeout", correlation_id=call_id, operation=operation)
        raise TimeoutError(f"{self.address}.{operation}: no reply within the deadline")

    async def _send_then_wait(self, call: _Call, message: bytes, presume: bool) -> None:
        """The common case: the request leaves at once, pre-settled, so only the reply is
        waited for, and ``Timeouts`` bounds that wait (no cancel scope to enter and leave)."""
        await self.sender.send(message, wait=False, presume_credit=presume)  # no wait inside
        if math.isinf(call.deadline):
            await call.done.wait()
            return
        timeouts = self.conn.client.timeouts
        timeouts.add(call)
        try:
            await call.done.wait()
        finally:
            timeouts.discard(call)

    def on_reply(self, message: Message) -> None:
        if not self.verified:
            self.check_answer()
            if self.error is not None:
                return
        props = message.properties
        correlation_id = props.correlation_id if props is not None else None
        call = self.calls.pop(correlation_id, None)
        if call is not None and trio.current_time() >= call.deadline:
            call.expire()  # due, though Timeouts has not woken it yet: the deadline wins
            call = None
        if call is None:  # its caller timed out or was cancelled: nobody waits for it
            self.conn.client.late_replies += 1
            self.log.debug("call.late_reply", correlation_id=correlation_id)
            return
        call.reply = message
        call.done.set()

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
        for half in (self.sender, self.receiver):
            half.attached.set()  # ends watch()
            if not amqp.closed.is_set():
                half.close(detach_with)


async def _mapped(amqp: transport.AmqpConnection, session: Session) -> None:
    """Wait for the peer's begin. A pipelined request must not reach a session the peer has
    not set up yet: Proton, whose application opens a session only after reading the whole
    burst, closes the connection with window-violation. The peer's begin nearly always comes
    in the same read as its open, so this loop rarely turns: the transport reports no
    session event to wait on."""
    while session.state is not SessionState.MAPPED:
        amqp.raise_if_closed()
        if session.state is not SessionState.BEGIN_SENT:
            raise ConnectionLostError("the peer ended our session")
        await trio.sleep(0.001)


@attrs.define(eq=False)
class _Connection:
    """One live AMQP connection of a client and the pairs on it (one per address)."""

    client: Client
    amqp: transport.AmqpConnection
    paired: bool
    log: Any
    pairs: dict[str, _Pair] = attrs.field(factory=dict)

    @property
    def alive(self) -> bool:
        # an error comes first: the engine is done with it before the socket is closed
        return self.amqp.error is None and not self.amqp.closed.is_set()


class Client:
    """A connection to a service container, shared by any number of tasks. Get one from
    ``connect()``; call through ``service(address)`` proxies or ``call()``."""

    def __init__(
        self,
        url: str,
        nursery: trio.Nursery,
        *,
        timeout: float | None,
        settled: bool,
        reconnect: bool,
        encoding: Encoding,
        reply_credit: int,
        connect_timeout: float,
        retry_delay: float,
        max_retry_delay: float,
        ssl_context: ssl.SSLContext | None,
        config: dict[str, Any],
    ) -> None:
        if reply_credit < 2:
            raise ValueError("reply_credit must be at least 2 (it is replenished by halves)")
        self.url = url
        self.timeout = timeout
        self.settled = settled
        self.reconnect = reconnect
        self.encoding = encoding
        self.reply_credit = reply_credit
        self.connect_timeout = connect_timeout
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self.late_replies = 0
        """Replies that came after their caller gave up (timeout, cancellation): dropped."""
        self._ssl_context = ssl_context
        desired = [LINK_PAIR_V1_0, *config.pop("desired_capabilities", ())]
        self._config = {**config, "desired_capabilities": desired}
        self._nursery = nursery
        self._ids = itertools.count(1)
        self.timeouts = Timeouts()
        nursery.start_soon(self.timeouts.run)
        self._conn: _Connection | None = None
        self._reconnect_lock = trio.Lock()
        self._failures = 0
        self._next_attempt = -math.inf
        self._closed = False

    # -- connections -----------------------------------------------------------------------

    async def _open(self) -> _Connection:
        """A new connection, once the peer's open has come (it says whether we may pair)."""
        with trio.move_on_after(self.connect_timeout) as scope:
            amqp: transport.AmqpConnection = await self._nursery.start(self._hold)
        if scope.cancelled_caught:
            raise TimeoutError(f"{self.url}: not connected within {self.connect_timeout} s")
        paired = offers_pairing(amqp.remote_offered_capabilities)
        conn_log = log.bind(conn=amqp.id, peer=amqp.peer)
        conn_log.info("client.connected", paired=paired)
        self._conn = _Connection(self, amqp, paired, conn_log)
        return self._conn

    async def _hold(
        self, *, task_status: trio.TaskStatus[transport.AmqpConnection] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep one connection open, in the client's nursery, until it closes or fails."""
        started = False
        try:
            async with net.connect(
                self.url,
                ssl_context=self._ssl_context,
                connect_timeout=self.connect_timeout,
                **self._config,
            ) as amqp:
                session = amqp.session  # begun now: it leaves in the same write as our open
                await amqp.wait_opened()
                await _mapped(amqp, session)
                task_status.started(amqp)
                started = True
                await amqp.closed.wait()
                if amqp.error is not None:
                    log.info("client.connection_lost", conn=amqp.id, error=str(amqp.error))
        except (*net.CONNECT_FAILURES, PairlinkError):
            if not started:
                raise  # to the caller of _open
            # after start the loss is reported to the calls through their links

    async def _live(self) -> _Connection:
        """The connection to call on: the current one, else (``reconnect``) a new one."""
        conn = self._conn
        if conn is not None and conn.alive:
            return conn
        if self._closed:
            raise ConnectionLostError("the client is closed")
        if not self.reconnect:
            assert conn is not None
            raise conn.amqp.error or ConnectionLostError("the connection is closed")
        async with self._reconnect_lock:  # one task reconnects; the others then use its work
            while self._conn is None or not self._conn.alive:
                await trio.sleep_until(self._next_attempt)
                try:
                    conn = await self._open()
                except AuthenticationError:
                    raise
                except (*net.CONNECT_FAILURES, TimeoutError) as exc:
                    self._failures += 1
                    delay = jittered_backoff(self._failures, self.retry_delay, self.max_retry_delay)
                    self._next_attempt = trio.current_time() + delay
                    log.warning(
                        "client.reconnect_failed",
                        url=self.url,
                        attempt=self._failures,
                        retry_in=round(delay, 3),
                        error=repr(exc),
                    )
                    continue
                self._failures = 0
                return conn
            return self._conn

    async def _pair(self, address: str) -> _Pair:
        conn = self._conn
        if conn is None or not conn.alive:
            conn = await self._live()
        pair = conn.pairs.get(address)
        if pair is None:
            pair = conn.pairs[address] = _Pair(conn, address, paired=conn.paired)
            pair.attach(self.settled, self.reply_credit)
            if conn.paired:
                self._nursery.start_soon(pair.watch)
                return pair
            await pair.wait_dynamic_address()
        elif not pair.ready.is_set():
            await pair.ready.wait()
        if pair.error is not None:
            raise pair.error
        return pair

    # -- calls -----------------------------------------------------------------------------

    async def call(
        self,
        address: str,
        operation: str,
        /,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline sent with the request
        encoding: Encoding | None = None,
        message_id: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call ``operation`` of the service at ``address``; returns its reply's value.

        ``timeout`` (default: the connection's; ``math.inf`` for none) is cut to what is left
        of the deadline of the call this task is serving, if any, and travels with the request.
        ``message_id``: the request's id, chosen by the caller (default: a counter). A string
        that stays the same when a call is repeated lets a service with ``dedup_window``
        answer the repeat from its stored reply; ``ValueError`` if a call with that id is
        still in flight to ``address`` on this connection.
        Raises ``RemoteError`` when the service answers with a failure, ``TimeoutError``,
        ``ConnectionLostError``, or ``LinkDetachedError`` when the peer refused the link.
        """
        limit = deadline.effective_timeout(self.timeout if timeout is None else timeout)
        if limit is not None and limit <= 0:
            raise TimeoutError(f"{address}.{operation}: the deadline has passed already")
        deadline_at = math.inf if limit is None else trio.current_time() + limit
        conn = self._conn
        pair = conn.pairs.get(address) if conn is not None and conn.alive else None
        if pair is None or not pair.ready.is_set():  # not the usual case: set-up to wait for
            pair = await self._pair_by(address, operation, deadline_at)
        call = (operation, args, kwargs, deadline_at, encoding or self.encoding, self.settled)
        try:
            return await pair.call(*call, message_id)
        except LinkDetachedError as exc:
            if pair.granted or exc.condition != conditions.TRANSFER_LIMIT_EXCEEDED:
                raise
        # LP-10: the service had no room for the pipelined first call and detached the pair
        # before granting it any credit, so none of its calls reached the service: send this
        # one again on a pair that waits for credit
        log.debug("call.no_room", address=address, operation=operation)
        pair = await self._pair_by(address, operation, deadline_at)
        if not pair.granted:
            pair.fresh = False
        return await pair.call(*call, message_id)

    async def _pair_by(self, address: str, operation: str, deadline_at: float) -> _Pair:
        """The pair for ``address``, set up (or reconnected) by ``deadline_at``."""
        pair = None
        with trio.move_on_at(deadline_at):
            pair = await self._pair(address)
        if pair is None:
            raise TimeoutError(f"{address}.{operation}: no connection within the deadline")
        return pair

    async def service(self, address: str, *, encoding: Encoding | None = None) -> ServiceProxy:
        """A proxy for the service at ``address``. On a peer that offers pairing nothing is
        sent yet: the pair is attached together with the first call (LP-10). Otherwise the
        classic links are set up now (one round trip for the dynamic reply address), within
        the connection's timeout."""
        with trio.move_on_after(math.inf if self.timeout is None else self.timeout) as scope:
            conn = await self._live()
            if not conn.paired:
                await self._pair(address)
        if scope.cancelled_caught:
            raise TimeoutError(f"{address}: not ready within {self.timeout} s")
        return ServiceProxy(self, address, encoding or self.encoding)

    async def aclose(self) -> None:
        """Close the connection politely; calls still in flight fail with
        ``ConnectionLostError``."""
        if self._closed:
            return
        self._closed = True
        if self._conn is not None and self._conn.alive:
            await self._conn.amqp.close()


class ServiceProxy:
    """Calls to one service: ``await proxy.call("add", 1, 2)`` or ``await proxy.add(1, 2)``.

    The keywords ``timeout`` and ``message_id`` belong to the call itself (and ``encoding`` to
    ``Client.call``): an operation's own parameters of those names can only be passed by
    position.
    """

    def __init__(self, client: Client, address: str, encoding: Encoding) -> None:
        self.client = client
        self.address = address
        self.encoding = encoding

    async def call(
        self,
        operation: str,
        /,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline sent with the request
        message_id: str | None = None,
        **kwargs: Any,
    ) -> Any:
        return await self.client.call(
            self.address,
            operation,
            *args,
            timeout=timeout,
            encoding=self.encoding,
            message_id=message_id,
            **kwargs,
        )

    def __getattr__(self, operation: str) -> Callable[..., Awaitable[Any]]:
        if operation.startswith("_"):
            raise AttributeError(operation)
        return functools.partial(self.call, operation)

    def __repr__(self) -> str:
        return f"<ServiceProxy {self.address!r} on {self.client.url}>"


@asynccontextmanager
async def connect(
    url: str,
    *,
    timeout: float | None = 30.0,  # noqa: ASYNC109 - the default deadline of each call
    settled: bool = True,
    reconnect: bool = False,
    encoding: Encoding = Encoding.ENVELOPE,
    reply_credit: int = 1000,
    connect_timeout: float = 30.0,
    retry_delay: float = 0.1,
    max_retry_delay: float = 5.0,
    ssl_context: ssl.SSLContext | None = None,
    **config: Any,
) -> AsyncIterator[Client]:
    """Connect to the container at ``amqp[s]://[user:password@]host[:port]``.

    ``timeout``: default per-call timeout in seconds (None: none). ``settled``: requests go
    pre-settled (the reply is the acknowledgement); False sends them unsettled and checks the
    service's disposition. ``reconnect``: once the connection is lost, new calls reconnect
    with jittered exponential backoff from ``retry_delay`` up to ``max_retry_delay`` seconds
    (calls in flight at the loss fail: a request may have been executed, only the caller can
    know whether repeating it is safe). ``reply_credit``: replies the service may send before
    we grant more. ``config``: engine settings (``container_id``, ``idle_timeout``, ``sasl``).
    Raises at once if the first connection fails.
    """
    with body_errors_unwrapped() as body:
        async with trio.open_nursery() as nursery:
            client = Client(
                url,
                nursery,
                timeout=timeout,
                settled=settled,
                reconnect=reconnect,
                encoding=encoding,
                reply_credit=reply_credit,
                connect_timeout=connect_timeout,
                retry_delay=retry_delay,
                max_retry_delay=max_retry_delay,
                ssl_context=ssl_context,
                config=config,
            )
            try:
                async with body:
                    await client._open()
                    yield client
            finally:
                try:
                    await client.aclose()
                finally:
                    nursery.cancel_scope.cancel()
