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
call is sent again) or its ``correlation-id``, so many calls share one pair and may complete in
any order. ``call`` speaks pairlink's conventions and returns a value; ``request`` sends a
message of the caller's making and returns the whole reply (``Reply``). Every failure
ends the calls it concerns at once: a detached or refused pair fails its calls with
``LinkDetachedError``, a lost connection fails every call in flight with
``ConnectionLostError``; a timeout raises ``TimeoutError`` and the reply, if it comes later,
is dropped.
"""

from __future__ import annotations

import itertools
import math
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar, Unpack

import trio

from pairlink._amqp.messaging import BodyKind, MessageId
from pairlink._client.options import CallOptions, ConnectConfig
from pairlink._client.pairs import CallConnection, CallPair
from pairlink._client.placement import CONNECTING, LOST, READY, ReplicaState
from pairlink._client.proxy import ServiceProxy
from pairlink._client.replicas import (
    RESOLVE_INTERVAL,
    Replica,
    Replicas,
    describe,
    in_flight,
    replicas_of,
    reply_address,
)
from pairlink._client.reply import Reply, compose_request
from pairlink._client.timeouts import Timeouts
from pairlink._io import net
from pairlink._io.backoff import jittered_backoff
from pairlink._io.connection import AmqpConnection
from pairlink._io.taskgroups import body_errors_unwrapped
from pairlink._rpc import deadline, wire
from pairlink._rpc.linkpair import (
    LINK_PAIR_V1_0,
    offers_pairing,
)
from pairlink._rpc.payload import Encoding
from pairlink._telemetry.logs import get_logger
from pairlink.errors import (
    AuthenticationError,
    ConnectionLostError,
    LinkDetachedError,
    PairlinkError,
)

log = get_logger("pairlink.client")

T = TypeVar("T")

CONNECT_TIMEOUT = 30.0
"""Seconds connecting may take when neither ``connect_timeout`` nor ``timeout`` bounds it."""
CLOSE_WAIT = 1.0
"""Seconds leaving ``connect()`` waits for the peer to answer our close before it drops the
socket: the close frame has gone out either way, so a peer that never answers (a wedged or
hostile one) costs the caller this long at most."""


class Client:
    """A connection to a service container, shared by any number of tasks. Get one from
    ``connect()``; call through ``service(address)`` proxies or ``call()``."""

    def __init__(
        self,
        url: str | Sequence[str],
        nursery: trio.Nursery,
        *,
        timeout: float | None,
        settled: bool,
        reconnect: bool,
        encoding: Encoding | None,
        reply_credit: int,
        connect_timeout: float,
        retry_delay: float,
        max_retry_delay: float,
        ssl_context: ssl.SSLContext | None,
        config: ConnectConfig,
        connector: net.Connector | None = None,
        resolve_interval: float = RESOLVE_INTERVAL,
        resolved: dict[str, list[str] | None] | None = None,
    ) -> None:
        if reply_credit < 2:
            raise ValueError("reply_credit must be at least 2 (it is replenished by halves)")
        self.url = url if isinstance(url, str) else ",".join(url)
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
        self._connector = connector
        desired = [LINK_PAIR_V1_0, *config.pop("desired_capabilities", ())]
        self._config: ConnectConfig = {**config, "desired_capabilities": desired}
        self._nursery = nursery
        self._ids = itertools.count(1)
        self.clock = trio.lowlevel.current_clock()
        """The run's clock: read once or twice per call, without ``trio.current_time``'s
        two calls on the way to it."""
        self.timeouts = Timeouts()
        nursery.start_soon(self.timeouts.run)
        self._conn: CallConnection | None = None
        self._reconnect_lock = trio.Lock()
        self._failures = 0
        self._next_attempt = -math.inf
        self._closed = False
        self._replicas: Replicas | None = None
        if not isinstance(url, str) or resolved:
            if connector is not None:
                raise ValueError("a connector opens the stream of one URL, not of replicas")
            self._replicas = Replicas(
                self,
                nursery,
                [url] if isinstance(url, str) else url,
                resolve_interval=resolve_interval,
                close_grace=CLOSE_WAIT,
                resolved=resolved,
            )
            # balanced calls; one URL keeps the direct path (bound here: no test per call)
            self._on_pair = self._replicas.exchange  # type: ignore[method-assign]
            self._call = self._balanced_call  # type: ignore[method-assign]

    def next_id(self) -> int:
        return next(self._ids)

    def _conns(self) -> list[CallConnection]:  # the current connection, or the replicas'
        if self._replicas is None:
            return [] if self._conn is None else [self._conn]
        return [e.conn for e in self._replicas.endpoints if e.conn is not None]

    @property
    def paired(self) -> bool | None:
        """Whether the current connection's peer offers link pairing (LP-2; with replicas:
        the first connected one's); None before the first connection."""
        conns = self._conns()
        return conns[0].paired if conns else None

    @property
    def call_encoding(self) -> Encoding | None:
        """The request body of a call that names no encoding: the one given to ``connect``,
        else the one the current connection's peer reads; None before the first connection."""
        conns = self._conns()
        if self.encoding is not None or not conns:
            return self.encoding
        return conns[0].encoding

    def in_flight(self, address: str | None = None) -> int:
        """Calls sent on the current connection, or the replicas' (to ``address``, or to
        any), and not answered."""
        pairs = [p for conn in self._conns() for a, p in conn.pairs.items() if address in (None, a)]
        return in_flight(pairs)

    @property
    def replicas(self) -> list[Replica]:
        """Each replica the client calls, with its state, free credit and calls in flight
        (one URL: one replica, ``ready`` while its connection is alive)."""
        if self._replicas is not None:
            return self._replicas.records()
        conn = self._conn
        state: ReplicaState = CONNECTING if conn is None else READY if conn.alive else LOST
        return [describe(self.url, None, state, conn)]

    async def wait_connection_lost(self) -> None:
        """Wait until the current connection has gone (at once if there is none): its calls
        in flight fail with it, and the next call reconnects, if ``reconnect`` allows. With
        replicas: until every replica's current connection has gone."""
        for conn in self._conns():
            await conn.amqp.closed.wait()

    # -- connections -----------------------------------------------------------------------

    async def _open(self) -> CallConnection | None:
        """A new connection, once the peer's open has come (it says whether we may pair);
        with replicas, their tasks, once one of them is ready (None)."""
        if self._replicas is not None:
            await self._replicas.start()
            return None
        self._conn = await self._connection(self.url, self._connector)
        return self._conn

    async def _connection(self, url: str, connector: net.Connector | None) -> CallConnection:
        """A new connection to ``url`` (over ``connector``'s stream if given)."""
        with trio.move_on_after(self.connect_timeout) as scope:
            amqp: AmqpConnection = await self._nursery.start(self._hold, url, connector)
        if scope.cancelled_caught:
            shown = net.redacted(url)
            raise TimeoutError(f"{shown}: not connected within {self.connect_timeout:g} s")
        offered = amqp.remote_offered_capabilities
        paired = offers_pairing(offered)
        encoding = wire.peer_encoding(offered)
        conn_log = log.bind(conn=amqp.id, peer=amqp.peer)
        conn_log.info("client.connected", paired=paired, encoding=encoding.name)
        return CallConnection(self, amqp, paired, conn_log, net.redacted(url), encoding=encoding)

    async def _hold(
        self,
        url: str,
        connector: net.Connector | None,
        *,
        task_status: trio.TaskStatus[AmqpConnection] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep one connection open, in the client's nursery, until it closes or fails."""
        started = False
        try:
            async with net.connect(
                url,
                ssl_context=self._ssl_context,
                connect_timeout=self.connect_timeout,
                connector=connector,
                **self._config,
            ) as amqp:
                session = amqp.session  # begun now: it leaves in the same write as our open
                await amqp.wait_opened()
                await amqp.wait_begun(session)
                task_status.started(amqp)
                started = True
                await amqp.closed.wait()
                if amqp.error is not None:
                    log.info("client.connection_lost", conn=amqp.id, error=str(amqp.error))
        except (*net.CONNECT_FAILURES, PairlinkError):
            if not started:
                raise  # to the caller of _open
            # after start the loss is reported to the calls through their links

    async def _live(self) -> CallConnection:
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
                    conn = await self._connection(self.url, self._connector)
                    self._conn = conn
                except AuthenticationError:
                    raise
                except (*net.CONNECT_FAILURES, TimeoutError) as exc:
                    self._failures += 1
                    delay = jittered_backoff(self._failures, self.retry_delay, self.max_retry_delay)
                    self._next_attempt = trio.current_time() + delay
                    log.warning(
                        "client.reconnect_failed",
                        url=net.redacted(self.url),
                        attempt=self._failures,
                        retry_in=round(delay, 3),
                        error=repr(exc),
                    )
                    continue
                self._failures = 0
                return conn
            return self._conn

    async def _pair(self, address: str) -> CallPair:
        if self._replicas is not None:
            return await self._replicas.pair(address)
        conn = self._conn
        if conn is None or not conn.alive:
            conn = await self._live()
        return await self._pair_on(conn, address)

    async def _pair_on(self, conn: CallConnection, address: str) -> CallPair:
        """The pair for ``address`` on ``conn``, attached now if need be, once ready."""
        pair = conn.pairs.get(address)
        if pair is None:
            pair = self._new_pair(conn, address)
            if conn.paired:
                return pair
            if self._replicas is None:  # (with replicas, a task waits for it)
                await pair.wait_dynamic_address()
        if not pair.ready.is_set():
            await pair.ready.wait()
        if pair.error is not None:
            raise pair.error
        return pair

    def _new_pair(self, conn: CallConnection, address: str) -> CallPair:
        """Attach a pair for ``address`` on ``conn`` (nothing awaited: on a peer that pairs,
        the first request may follow in the same write); with replicas, a call that never
        left it goes to another replica (``NotSent``), and a classic pair waits for its reply
        address in a task of its own."""
        pair = conn.pairs[address] = CallPair(conn, address, paired=conn.paired)
        pair.attach(self.settled, self.reply_credit)
        if conn.paired:
            self._nursery.start_soon(pair.watch)
        if self._replicas is not None:
            pair.resendable = True
            if not conn.paired:
                self._nursery.start_soon(reply_address, pair)
        return pair

    # -- calls -----------------------------------------------------------------------------

    async def _balanced_call(
        self,
        address: str,
        timeout: float | None,  # noqa: ASYNC109 - a deadline sent with the request
        encoding: Encoding | None,
        message_id: str | None,
        operation: str,
        /,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """``_call`` with replicas: on the pair the balance picks, and on another whenever
        the replica did not take it (:meth:`Replicas.exchange`)."""
        clock = self.clock
        deadline_at = self._deadline_at(address, operation, timeout, clock.current_time())
        call = (operation, args, kwargs, deadline_at, encoding or self.encoding, self.settled)
        return await self._on_pair(
            address,
            operation,
            deadline_at,
            lambda pair: pair.call(*call, message_id, clock.current_time()),
        )

    async def call(
        self,
        address: str,
        operation: str,
        /,
        *args: Any,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline sent with the request
        encoding: Encoding | None = None,
        message_id: str | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **keywords: Any,
    ) -> Any:
        """Call ``operation`` of the service at ``address``; returns its reply's value.

        The keywords ``timeout``, ``encoding``, ``message_id`` and ``kwargs`` are this call's
        options; every other keyword goes to the operation. An operation's own keyword of one
        of those four names goes in the ``kwargs`` mapping (or through a proxy, whose keywords
        all go to the operation): ``call("svc", "wait", kwargs={"timeout": 5})``.

        ``timeout`` (default: the connection's; ``math.inf`` for none) is cut to what is left
        of the deadline of the call this task is serving, if any, and travels with the request.
        ``message_id``: the request's id, chosen by the caller (default: a counter). A string
        that stays the same when a call is repeated lets a service with ``dedup_window``
        answer the repeat from its stored reply; ``ValueError`` if a call with that id is
        still in flight to ``address`` on this connection.
        Raises ``RemoteError`` when the service answers with a failure, ``TimeoutError``,
        ``ConnectionLostError``, or ``LinkDetachedError`` when the peer refused the link.
        """
        if kwargs:
            if twice := keywords.keys() & kwargs.keys():
                raise TypeError(f"keyword arguments given twice: {', '.join(sorted(twice))}")
            keywords = {**kwargs, **keywords}
        return await self._call(
            address, timeout, encoding, message_id, operation, *args, **keywords
        )

    async def _call(
        self,
        address: str,
        timeout: float | None,  # noqa: ASYNC109 - a deadline sent with the request
        encoding: Encoding | None,
        message_id: str | None,
        operation: str,
        /,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """``call`` with its options apart, what a proxy's operations are bound to: the only
        coroutine between a proxy's call and its pair's (each level cost every call a frame
        and its resumptions). The clock is read once, for the deadline and the request's ttl,
        and again only after waiting for a pair. A call the service had no room for at once
        goes again on a new pair (LP-10)."""
        now = self.clock.current_time()
        deadline_at = self._deadline_at(address, operation, timeout, now)
        pair = self._ready_pair(address)
        if pair is None:  # not the usual case: set-up to wait for
            pair = await self._pair_by(address, operation, deadline_at)
            now = self.clock.current_time()
        call = (operation, args, kwargs, deadline_at, encoding or self.encoding, self.settled)
        try:
            return await pair.call(*call, message_id, now)
        except LinkDetachedError as exc:
            if not pair.had_no_room(exc):
                raise
        pair = await self._pair_again(pair, address, operation, deadline_at)
        return await pair.call(*call, message_id, self.clock.current_time())

    async def request(
        self,
        address: str,
        body: object = None,
        *,
        body_kind: BodyKind = "value",
        subject: str | None = None,
        to: str | None = None,
        application_properties: Mapping[str, object] | None = None,
        message_id: MessageId | None = None,
        correlation_id: MessageId | None = None,
        content_type: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline sent with the request
    ) -> Reply:
        """Send one message to ``address`` and return its whole reply, nothing interpreted:
        for services with conventions of their own (RabbitMQ's ``/management``, AMQP
        management nodes, any AMQP server that answers ``reply-to``).

        ``body`` goes in the one section ``body_kind`` says: ``"value"`` (an amqp-value: any
        AMQP value, the default), ``"data"`` (bytes, or a list of bytes for several data
        sections) or ``"sequence"`` (a list of amqp-sequence sections, each a list). Or pass a
        whole :class:`~pairlink._amqp.messaging.Message` as ``body`` (header, annotations and
        all): it is sent as given, the keywords set the fields they name.

        ``message_id`` (default: a counter) and ``correlation_id`` (default: the message-id,
        as a call's) are the request's own; the reply is matched by its correlation-id, equal
        to either of them (servers copy one or the other).
        ``reply-to`` is always the pair's reply address (``$me`` on a paired link), where
        the reply must come. The deadline (``timeout`` as for :meth:`call`) travels as the
        request's ``header.ttl`` and ``absolute-expiry-time`` unless the message has one.
        The request goes pre-settled or not as the client's ``settled`` says; unsettled, the
        service's outcome comes back in ``Reply.outcome``, and a request it did not accept
        returns at once with no reply message.

        Raises ``TimeoutError``, ``ConnectionLostError``, ``LinkDetachedError`` (never
        ``RemoteError``: a status is the caller's to read, ``Reply.status``), and
        ``ValueError`` if a request with that message-id is in flight to ``address``.
        """
        label = subject or "request"
        deadline_at = self._deadline_at(address, label, timeout, self.clock.current_time())
        message = compose_request(
            body,
            body_kind=body_kind,
            subject=subject,
            to=to,
            application_properties=application_properties,
            message_id=message_id,
            correlation_id=correlation_id,
            content_type=content_type,
        )
        settled = self.settled
        return await self._on_pair(
            address,
            label,
            deadline_at,
            lambda pair: pair.request(message, deadline_at, settled, label),
        )

    def _deadline_at(self, address: str, label: str, timeout: float | None, now: float) -> float:
        """The Trio time by which a request made at ``now`` must be answered (see ``call``'s
        ``timeout``)."""
        limit = deadline.effective_timeout(self.timeout if timeout is None else timeout)
        if limit is None:
            return math.inf
        if limit <= 0:
            raise TimeoutError(f"{address}.{label}: the deadline has passed already")
        return now + limit

    async def _on_pair(
        self,
        address: str,
        label: str,
        deadline_at: float,
        exchange: Callable[[CallPair], Awaitable[T]],
    ) -> T:
        """``exchange`` on the pair for ``address``, set up first if need be, and once more
        on a new pair if the service had no room for it at once (LP-10)."""
        pair = self._ready_pair(address)
        if pair is None:  # not the usual case: set-up to wait for
            pair = await self._pair_by(address, label, deadline_at)
        try:
            return await exchange(pair)
        except LinkDetachedError as exc:
            if not pair.had_no_room(exc):
                raise
        return await exchange(await self._pair_again(pair, address, label, deadline_at))

    def _ready_pair(self, address: str) -> CallPair | None:
        """The pair for ``address`` if it is set up and its connection alive (the usual
        case); None: it is to be set up, or waited for."""
        conn = self._conn
        pair = conn.pairs.get(address) if conn is not None and conn.alive else None
        return pair if pair is not None and pair.ready.is_set() else None

    async def _pair_again(
        self, pair: CallPair, address: str, label: str, deadline_at: float
    ) -> CallPair:
        """LP-10: the service had no room for the pipelined first request and detached the
        pair before granting it any credit, so none of its requests reached the service: the
        pair to send this one again on, which waits for credit."""
        pair.log.debug("call.no_room", operation=label)  # its conn, link and address
        pair = await self._pair_by(address, label, deadline_at)
        if not pair.granted:
            pair.fresh = False
        return pair

    async def _pair_by(self, address: str, label: str, deadline_at: float) -> CallPair:
        """The pair for ``address``, set up (or reconnected) by ``deadline_at``."""
        pair = None
        with trio.move_on_at(deadline_at):
            pair = await self._pair(address)
        if pair is None:
            raise TimeoutError(f"{address}.{label}: no connection within the deadline")
        return pair

    async def service(
        self,
        address: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the default deadline of its calls
        encoding: Encoding | None = None,
    ) -> ServiceProxy:
        """A proxy for the service at ``address``; ``timeout`` and ``encoding`` are its
        calls' options (default: the connection's). On a peer that offers pairing nothing
        is sent yet: the pair is attached together with the first call (LP-10). Otherwise
        the classic links are set up now (one round trip for the dynamic reply address),
        within the connection's timeout."""
        with trio.move_on_after(math.inf if self.timeout is None else self.timeout) as scope:
            conn = await (self._live() if self._replicas is None else self._replicas.live())
            if not conn.paired:
                await self._pair(address)
        if scope.cancelled_caught:
            raise TimeoutError(f"{address}: not ready within {self.timeout} s")
        return ServiceProxy(self, address, CallOptions(timeout=timeout, encoding=encoding))

    async def aclose(self) -> None:
        """Close the connection politely; calls still in flight fail with
        ``ConnectionLostError``."""
        if self._closed:
            return
        self._closed = True
        if self._replicas is not None:
            await self._replicas.aclose(CLOSE_WAIT)
        elif self._conn is not None and self._conn.alive:
            await self._conn.amqp.close(grace=CLOSE_WAIT)


def _connect_timeout(timeout: float | None, connect_timeout: float | None) -> float:
    """How long connecting may take: ``connect_timeout`` if given, else the calls' timeout."""
    if connect_timeout is not None:
        return connect_timeout
    return CONNECT_TIMEOUT if timeout is None else timeout


@asynccontextmanager
async def connect(
    url: str | Sequence[str],
    *,
    timeout: float | None = 30.0,  # noqa: ASYNC109 - the default deadline of each call
    settled: bool = True,
    reconnect: bool = True,
    encoding: Encoding | None = None,
    reply_credit: int = 1000,
    connect_timeout: float | None = None,
    retry_delay: float = 0.1,
    max_retry_delay: float = 5.0,
    ssl_context: ssl.SSLContext | None = None,
    connector: net.Connector | None = None,
    resolve_interval: float = RESOLVE_INTERVAL,
    **config: Unpack[ConnectConfig],
) -> AsyncIterator[Client]:
    """Connect to the container at ``amqp[s]://[user:password@]host[:port]``, or to the
    replicas of a service: a list of such URLs, or one whose host name resolves to several
    addresses (one replica per address; a list of one such URL is followed as the name
    changes, resolved again every ``resolve_interval`` seconds, ``RESOLVE_INTERVAL``: 30).
    Each call goes to the ready replica with the most free credit (README, "Replicas"); with
    replicas, ``connect`` returns once each has been tried, and raises if none is ready.

    ``timeout``: default per-call timeout in seconds (None: none); it bounds connecting as
    well, unless ``connect_timeout`` says otherwise (with no ``timeout`` either:
    ``CONNECT_TIMEOUT``, 30 s): TCP, TLS, SASL and the peer's open, each (re)connection.
    Leaving the block closes the connection, waiting ``CLOSE_WAIT`` (1 s) at most for the
    peer's answer. ``settled``: requests go
    pre-settled (the reply is the acknowledgement); False sends them unsettled and checks the
    service's disposition. ``reconnect`` (default, as gRPC channels and Proton containers
    do): once the connection is lost, new calls reconnect with jittered exponential backoff
    from ``retry_delay`` up to ``max_retry_delay`` seconds, each waiting within its own
    deadline (a restarted server is found again); calls in flight at the loss fail (a
    request may have been executed, only the caller can know whether repeating it is
    safe). ``reconnect=False``: after a loss every call fails with ``ConnectionLostError``.
    ``encoding``: the request body of every call that names none; by default pairlink's
    envelope when the peer offers ``pairlink:call-envelope`` (a pairlink container or
    gateway), else an ``amqp-value`` any AMQP server reads (README, "Message bodies").
    ``reply_credit``: replies the service may send before we grant more. ``connector``: opens
    each connection's stream instead of TCP to the URL (``pairlink.testing`` connects over
    in-memory streams with it; the URL still names the host for SASL). ``config``: engine
    settings (:class:`ConnectConfig`: ``container_id``, ``idle_timeout``, ``sasl``...).
    Raises at once if the first connection fails (with replicas: if every one fails).
    """
    resolved: dict[str, list[str] | None] = {}
    with trio.move_on_after(_connect_timeout(timeout, connect_timeout)):  # else: as one URL
        resolved = await replicas_of(url, connector)
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
                connect_timeout=_connect_timeout(timeout, connect_timeout),
                retry_delay=retry_delay,
                max_retry_delay=max_retry_delay,
                ssl_context=ssl_context,
                config=config,
                connector=connector,
                resolve_interval=resolve_interval,
                resolved=resolved,
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
