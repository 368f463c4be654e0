"""The Trio layer under the AMQP engine: sockets, TLS, time and tasks, nothing about the protocol.

Each connection runs three tasks in its own nursery: one reader (bytes -> engine -> events),
one writer (everything the engine queued since the last send goes out in one ``send_all``, so a
burst of frames costs one system call), and one timer (heartbeats, idle timeout). Leaving the
``connect``/``listen`` context, cleanly or by cancellation, closes the connection and the
socket and leaves no task behind. Network failures never escape a background task: they fail
the operations waiting on that connection with ``ConnectionLostError``.

:class:`AmqpConnection` is the one place where the Trio layer meets the engine: every layer
above acts through its methods (``flow``, ``send``, ``settle``, ``detach``, ``attach``...),
which wake the writer and turn engine refusals into pairlink errors. It also keeps the
connection's own limits: an exception in handling its input closes it alone
(``amqp:internal-error``), and a peer that does not read what we send gets no new credit,
then is not read either (``MAX_OUTGOING_BYTES``). :mod:`pairlink._io.net` makes connections
(URLs, connect, listen, TLS).
"""

from __future__ import annotations

import itertools
import math
import os
import ssl
import threading
from collections.abc import Callable
from typing import Any

import trio

from pairlink._amqp import errors as conditions
from pairlink._amqp.connection import Connection, ConnectionConfig
from pairlink._amqp.errors import LocalProtocolError
from pairlink._amqp.events import (
    ConnectionClosed,
    ConnectionOpened,
    DeliveryUpdated,
    Event,
    LinkAttached,
    LinkAttachRequested,
    LinkDetached,
    LinkFlow,
    MessageReceived,
    ProtocolViolation,
    SaslDone,
    SessionBegun,
    SessionEnded,
    TransportFailed,
)
from pairlink._amqp.link import Delivery, Link, LinkState
from pairlink._amqp.messaging import Error, Source, Target
from pairlink._amqp.session import Session, SessionState
from pairlink._io import link_events
from pairlink._io.link_events import LinkEvents
from pairlink._io.logs import get_logger, new_ref
from pairlink._io.plain_socket import receive, write_nowait
from pairlink.errors import (
    AuthenticationError,
    ConnectionLostError,
    LinkDetachedError,
    MessageTooLargeError,
)

log = get_logger("pairlink.transport")

READ_SIZE = 1 << 16
FEED_SLICE = 1 << 12
"""The engine is fed at most this many bytes at a time; between slices the writer gets its
turn if the engine has replies to send. A 64 KiB read can hold hundreds of small calls: fed
whole, the peer waited for all of them to be answered before it saw the first reply, and the
two processes never worked at the same time (measured: ~1.6x the throughput with 4 KiB
slices; 8 KiB and more lose most of it, 2 KiB gains nothing more)."""
MAX_OUTGOING_BYTES = 16 << 20
"""Bytes a connection may hold for a peer that is not reading them (16 MiB).

Two stages, so that a peer that does not read slows only itself: from a quarter of this on, we
grant that peer no new credit (it can send us only what it was already allowed to, so its
requests stop making replies); past all of it, which only control frames or credit granted
earlier can cause, we stop reading from it. Both end once an eighth of it is left. We keep
reading in the first stage on purpose: a peer whose own sends to us are backed up (a gateway
relaying large messages both ways) must be able to drain into us, or two honest peers that
each wait for the other to read would wait forever."""
_LINK_OPEN = (LinkState.ATTACH_SENT, LinkState.ATTACHED)
_NETWORK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError)
_conn_ids = itertools.count(1)


class _AfterInput(threading.local):
    """The connections kicked while an input is dispatched (per thread: a blocking client runs
    its own Trio loop): each is written through once the input is done, in one non-blocking
    write, not by waking its writer (for a gateway, a task step and a send per read saved)."""

    kicked: list[AmqpConnection] | None = None


_after_input = _AfterInput()


OnAttach = Callable[["AmqpConnection", Link], None]
"""Called for each link the peer opens; must answer it (``pairlink._io.links.accept``) or
``refuse`` it."""


class AmqpConnection:
    """A live AMQP connection over a Trio stream; create it with ``connect`` or ``listen``."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        config: ConnectionConfig,
        *,
        initiator: bool,
        peer: str,
        on_attach: OnAttach | None = None,
        max_outgoing_bytes: int = MAX_OUTGOING_BYTES,
    ) -> None:
        self.stream = stream
        self.engine = Connection(config, initiator=initiator)
        self.peer = peer
        self.on_attach = on_attach
        self.id = next(_conn_ids)
        self.log = log.bind(conn=self.id, peer=peer, container=config.container_id)
        self.opened = trio.Event()
        self.closed = trio.Event()
        self.flushed = trio.Event()  # the writer is done: last bytes sent, socket closed
        self._eof = trio.Event()  # the reader saw the peer's EOF (or a dead socket)
        self._close_answered = False  # the peer answered our close: it has nothing to read
        self.error: ConnectionLostError | None = None
        self._kick_send, self._kick_recv = trio.open_memory_channel[None](1)
        self._kicked = False  # a wake-up is pending: further kicks need not touch the channel
        self._timer_kick = trio.Event()
        self._session: Session | None = None
        self._session_waiters: dict[Session, trio.Event] = {}
        self._names = itertools.count(1)
        self._input_hold: trio.Event | None = None
        self.max_outgoing_bytes = max_outgoing_bytes
        self._sending = 0  # bytes handed to the socket whose send has not returned yet
        self._unsent = b""  # the rest of a write-through the socket did not take: next out
        tcp = stream if isinstance(stream, trio.SocketStream) and os.name == "posix" else None
        self._socket = None if tcp is None else tcp.socket  # read and written directly too
        self._backlogged = False  # the peer is behind on reading: new credit is held back
        self._drained = trio.Event()  # set when a backlog has gone
        self._deferred_flows: dict[Link, int] = {}  # credit increases held back meanwhile
        self._abandoned = False  # an exception in our own handling: input is ignored

    # -- lifecycle -------------------------------------------------------------------------

    async def _run(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._read_loop)
        nursery.start_soon(self._write_loop)
        nursery.start_soon(self._timer_loop)

    def kick(self) -> None:
        """Wake the writer: whatever the engine queued goes out in its next send. Called
        several times per call; once a wake-up is pending, it carries these bytes too. While
        an input is dispatched, plain TCP connections are written through after it instead."""
        if self._kicked:
            return
        self._kicked = True
        after = _after_input.kicked
        if after is not None and self._socket is not None:
            after.append(self)
            return
        self._kick_send.send_nowait(None)  # never full: the writer took the last one

    async def wait_opened(self) -> None:
        """Wait for the peer's open (SASL done); raises if the connection failed first."""
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def watch_close() -> None:
                    await self.closed.wait()
                    scope.cancel()

                nursery.start_soon(watch_close)
                await self.opened.wait()
                nursery.cancel_scope.cancel()
        self.raise_if_closed()

    def raise_if_closed(self) -> None:
        if self.error is not None:
            raise self.error
        if self.closed.is_set():
            raise ConnectionLostError("the connection is closed")

    async def close(self, error: Error | None = None, *, grace: float = 5.0) -> None:
        """Close cleanly: send close, wait ``grace`` seconds at most for the peer's, then
        drop the socket."""
        if not self.closed.is_set():
            self.engine.close(error)
            self.kick()
            with trio.move_on_after(grace):
                await self.closed.wait()
        self._finish(None)

    def abort(self, error: ConnectionLostError) -> None:
        """Give up on the connection at once: nothing more is read, what is queued is sent,
        and the socket closes (a peer that never finished its handshake, for one)."""
        self._abandoned = True
        self._finish(error)

    def _finish(self, error: ConnectionLostError | None) -> None:
        if self.closed.is_set():
            return
        if error is not None:
            self.error = error
            self.log.info("connection.failed", error=str(error))
        else:
            self.log.info("connection.closed")
        self.closed.set()
        if self._input_hold is not None:  # the reader goes on to the peer's EOF
            self._input_hold.set()
        self.kick()  # the writer flushes what is left (a close reply) and ends
        self._timer_kick.set()
        self._drained.set()
        for waiter in self._session_waiters.values():
            waiter.set()
        self._session_waiters.clear()
        for session in list(self.engine.sessions.values()):
            for link in list(session.links.values()):
                end: LinkEvents | None = link.user_data
                if end is not None:
                    try:
                        end.on_ended()
                    except Exception as exc:  # the connection is over: log it, wake the rest
                        self.log.error("link.end_failed", link=link.name, exc_info=exc)

    # -- tasks -----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        """Read until the peer's EOF, even after the engine is done: draining what the peer
        still sends lets our close end in a FIN, not a reset that could destroy our last
        frames (a SASL outcome, a close) before the peer reads them."""
        engine, sock = self.engine, self._socket
        try:
            while True:
                try:
                    if sock is None:
                        data = await self.stream.receive_some(READ_SIZE)
                    else:  # plain TCP: wait, then read (pairlink._io.plain_socket)
                        data = await receive(sock, READ_SIZE)
                except _NETWORK_ERRORS as exc:
                    self._dispatch(engine.connection_lost(), lost=f"read failed: {exc!r}")
                    return
                if not data:
                    self._dispatch(engine.receive_data(b""), lost="the peer closed the socket")
                    return
                if self._abandoned:
                    continue  # read on to the peer's EOF, feeding nothing
                if len(data) > FEED_SLICE:
                    await self._feed_sliced(data)
                elif self._feed(data):
                    await self._resume_held()
                if self._waiting_bytes() > self.max_outgoing_bytes:
                    await self._stop_reading()
        finally:
            self._eof.set()

    def _waiting_bytes(self) -> int:
        """What we hold for the peer: queued in the engine, and in a send not yet done."""
        return self._sending + len(self._unsent) + self.engine.output_size

    def _hold_credit(self) -> None:
        if not self._backlogged:
            self._backlogged = True
            self._drained = trio.Event()
            self.log.info("peer.backlogged", waiting=self._waiting_bytes())

    async def _stop_reading(self) -> None:
        """Past ``max_outgoing_bytes``: read nothing more from this peer until it drained."""
        self._hold_credit()
        self.log.warning("peer.not_reading", waiting=self._waiting_bytes())
        self.kick()
        await self._drained.wait()

    def _check_drained(self) -> None:
        """From the writer: once the backlog is down to an eighth of the bound, give the peer
        the credit held back meanwhile, and let the reader go on."""
        if self._waiting_bytes() > self.max_outgoing_bytes // 8:
            return
        self._backlogged = False
        self._drained.set()
        self.log.info("peer.drained")
        flows, self._deferred_flows = self._deferred_flows, {}
        for link, more in flows.items():
            self.flow(link, link.link_credit + more)

    async def _feed_sliced(self, data: bytes | bytearray) -> None:
        """Feed a read larger than ``FEED_SLICE`` in pieces of that size, what each piece's
        calls produced going out before the next is decoded: written after the piece, or, what
        the socket did not take, by the writer, which gets its turn first (a large message's
        bytes alone yield nothing to send, so they cost no extra task switch)."""
        view = memoryview(data)
        for start in range(0, len(view), FEED_SLICE):
            if start and (self.engine.has_output or self._unsent):
                if self._waiting_bytes() > self.max_outgoing_bytes:
                    await self._stop_reading()
                else:
                    await trio.lowlevel.checkpoint()
            if self._abandoned:
                return
            if self._feed(view[start : start + FEED_SLICE]):
                await self._resume_held()

    def _feed(self, data: bytes | bytearray | memoryview | None) -> bool:
        """Hand bytes to the engine (None: resume the input it holds) and dispatch what they
        meant; True when an ``on_attach`` held the input (``hold_input``), with bytes still
        waiting in the engine. What the input gave any connection to send, this one's answer
        included, goes out once it is dispatched (``_AfterInput``)."""
        engine = self.engine
        held = False
        now = trio.current_time()  # dates the input (the idle timeout counts from it), the answer
        outer, _after_input.kicked = _after_input.kicked, []
        try:
            events = engine.resume_input() if data is None else engine.receive_data(data, now)
            while True:
                self._dispatch(events)
                if not engine.input_paused or self._abandoned:
                    break
                if self._input_hold is not None:
                    held = True
                    break
                events = engine.resume_input()
        except Exception as exc:  # the engine's own bug: this connection alone pays for it
            self._abandon(exc)
        finally:
            if engine.has_output or engine.transport_done:  # the engine's own answers too
                self.kick()
            kicked, _after_input.kicked = _after_input.kicked, outer
        for conn in kicked:
            conn._kicked = False
            if not conn._write_through(now):
                conn.kick()
        return held

    def _write_through(self, now: float | None = None) -> bool:
        """One non-blocking write of what the engine queued, from the reader (or a lone caller):
        no writer wake-up (two task steps and a run-loop pass per sequential call). Plain TCP,
        writer idle, nothing queued before; False: the writer sends the rest, reports errors."""
        socket, engine = self._socket, self.engine
        idle = not (self._sending or self._unsent or self._backlogged or self._abandoned)
        if socket is None or not idle or engine.transport_done or self.closed.is_set():
            return False
        data = engine.data_to_send(trio.current_time() if now is None else now)
        sent = write_nowait(socket, data) if data else 0
        self._unsent = data[sent:]
        return not self._unsent

    def _abandon(self, exc: Exception) -> None:
        """Backstop: an exception escaped our handling of this connection's input (engine,
        container, actor, gateway or client code). Close this connection alone with
        ``amqp:internal-error``, log the traceback under a reference the peer is told, and
        ignore the rest of its input; the listener and every other connection go on."""
        if self._abandoned:
            return
        self._abandoned = True
        ref = new_ref()
        self.log.error("connection.internal_error", ref=ref, exc_info=exc)
        error = Error(conditions.INTERNAL_ERROR, f"internal error (ref {ref})")
        try:
            if not self.engine.closed:
                self.engine.close(error)
        except Exception as close_exc:  # the engine is past saying anything: just hang up
            self.log.error("connection.close_failed", ref=ref, exc_info=close_exc)
        self._finish(ConnectionLostError(f"internal error (ref {ref})", conditions.INTERNAL_ERROR))

    async def _resume_held(self) -> None:
        while self._input_hold is not None:
            await self._input_hold.wait()
            self._input_hold = None
            if self._feed(None):
                continue
            return

    def hold_input(self) -> Callable[[], None]:
        """From ``on_attach``: read none of the peer's later frames until the returned
        ``release`` is called, so an attach can be answered after a round trip elsewhere (a
        gateway pairs upstream first) and still be answered, with its credit, before a
        pipelined transfer on it is read (LP-10). Hold it briefly: nothing else on this
        connection is read meanwhile."""
        gate = self._input_hold = trio.Event()
        return gate.set

    async def _write_loop(self) -> None:
        engine = self.engine
        try:
            async for _ in self._kick_recv:
                self._kicked = False
                # transport_done is read before the send: bytes queued while a send was in
                # progress (a SASL outcome, a close reply) still go out on the next round
                done = engine.transport_done or self._abandoned
                data, self._unsent = self._unsent + engine.data_to_send(trio.current_time()), b""
                if data:
                    self._sending = len(data)
                    try:
                        await self.stream.send_all(data)
                    except _NETWORK_ERRORS as exc:
                        self._dispatch(engine.connection_lost(), lost=f"write failed: {exc!r}")
                        return
                    finally:
                        self._sending = 0
                    if self._backlogged:
                        self._check_drained()
                if done:
                    break  # the engine said everything it will say: the socket can go
            await self._hang_up()
            self._finish(self.error)
        finally:
            self.flushed.set()

    async def _hang_up(self) -> None:
        """Close the socket. When the peer still has to read our last words (our answer to
        its close, a SASL refusal, a close for its error), give it a moment (bounded) to close
        its end first: closing with its bytes unread would reset the connection, and a reset
        can destroy our last frames before the peer reads them. When it answered our close,
        it has nothing left to read: close at once."""
        if not self._close_answered:
            with trio.move_on_after(1):
                await self._eof.wait()
        await trio.aclose_forcefully(self.stream)

    async def _timer_loop(self) -> None:
        engine = self.engine
        while not self.closed.is_set():
            try:
                events = engine.tick(trio.current_time())
            except Exception as exc:
                self._abandon(exc)
                return
            self._dispatch(events)
            self.kick()
            deadline = engine.next_deadline
            self._timer_kick = trio.Event()
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await self._timer_kick.wait()

    # -- events ----------------------------------------------------------------------------

    def _dispatch(self, events: list[Event], lost: str | None = None) -> None:
        try:
            for event in events:
                handler = _HANDLERS.get(type(event))
                if handler is not None:
                    handler(self, event)
        except Exception as exc:
            self._abandon(exc)
        if lost is not None:
            self._finish(self.error or ConnectionLostError(lost))

    def _on_sasl(self, event: SaslDone) -> None:
        if event.outcome != 0:
            self.error = AuthenticationError(
                f"SASL {event.mechanism} refused (code {event.outcome})", "amqp:unauthorized-access"
            )
            if not self.engine.initiator:  # a refused login: who tried, from where (peer)
                self.log.warning("sasl.refused", mechanism=event.mechanism, user=event.identity)
        else:
            self.log.debug("sasl.done", mechanism=event.mechanism, identity=event.identity)

    def _on_opened(self, _event: ConnectionOpened) -> None:
        self.opened.set()
        self._timer_kick.set()  # the peer's idle-time-out may add a heartbeat deadline
        self.log.debug("connection.opened", remote=self.engine.remote_open)

    def _on_closed(self, event: ConnectionClosed) -> None:
        self._close_answered = not event.by_peer
        error = None
        if event.error is not None:
            error = ConnectionLostError.from_amqp(event.error, "the peer closed the connection")
        self._finish(error)

    def _on_violation(self, event: ProtocolViolation) -> None:
        if event.cause is not None:  # our own engine's fault, not the peer's
            self.log.error("connection.internal_error", why=event.description, exc_info=event.cause)
        else:
            self.log.warning("protocol.violation", condition=event.condition, why=event.description)
        self.error = ConnectionLostError(event.description, event.condition)

    def _on_transport_failed(self, event: TransportFailed) -> None:
        self._finish(self.error or ConnectionLostError(event.reason))

    def _on_attach_requested(self, event: LinkAttachRequested) -> None:
        link = event.link
        self.log.debug("link.requested", link=link.name, role=link.role)
        if self.on_attach is None:
            self.refuse(link, Error(conditions.NOT_ALLOWED, "this container accepts no links"))
        else:
            self.on_attach(self, link)
        self.kick()

    def _on_session_begun(self, event: SessionBegun | SessionEnded) -> None:
        """Wake ``wait_begun``: it reads from the session's state whether it began or ended."""
        waiter = self._session_waiters.pop(event.session, None)
        if waiter is not None:
            waiter.set()

    def _on_session_ended(self, event: SessionEnded) -> None:
        if event.session is self._session:
            self._session = None
        self._on_session_begun(event)

    # -- acting on the engine (see the module docstring) -----------------------------------

    def flow(self, link: Link, credit: int, *, drain: bool = False) -> None:
        """As receiver: set the link's credit (absolute). While the peer is not reading what
        we send (``backlogged``), credit increases wait and go out when it drains. ``drain``
        asks the sender to use the credit now or give it back (it goes out at once)."""
        if not self._link_open(link):
            return
        if (
            not drain
            and credit > link.link_credit
            and (self._backlogged or self._waiting_bytes() > self.max_outgoing_bytes // 4)
        ):
            self._hold_credit()
            # the increase, not the value: what arrives meanwhile uses up the credit it had
            self._deferred_flows[link] = credit - link.link_credit
            return
        self._deferred_flows.pop(link, None)
        self.engine.flow(link, credit, drain=drain)
        self.kick()

    def complete_drain(self, link: Link) -> None:
        """As sender with nothing to send: answer the receiver's drain (Part 2 §2.6.7)."""
        if self._link_open(link):
            self.engine.complete_drain(link)
            self.kick()

    def settle(self, delivery: Delivery, state: Any = None) -> None:
        """Declare the outcome of a delivery we received, and settle it."""
        if not delivery.settled and self._link_open(delivery.link):
            self.engine.settle(delivery, state)
            self.kick()

    def send(
        self,
        link: Link,
        payload: bytes | memoryview,
        *,
        settled: bool | None = None,
        presume_credit: bool = False,
        through: bool = False,
    ) -> Delivery:
        """Send one message on ``link`` (``through``: write it from here if the writer is idle
        and not woken: a lone call). Raises ``MessageTooLargeError`` past the peer's max size,
        ``LinkDetachedError``/``ConnectionLostError`` when the link or connection cannot."""
        self.raise_if_closed()
        try:
            delivery = self.engine.send(
                link, payload, settled=settled, presume_credit=presume_credit
            )
        except LocalProtocolError as exc:
            if exc.condition == conditions.MESSAGE_SIZE_EXCEEDED:
                raise MessageTooLargeError(
                    len(payload), link.remote_max_message_size or 0
                ) from None
            raise LinkDetachedError(
                f"link {link.name!r} cannot send: {exc.description}", exc.condition
            ) from None
        if not (through and not self._kicked and self._write_through()):
            self.kick()
        return delivery

    def detach(self, link: Link, *, error: Error | None = None, closed: bool = True) -> None:
        """Detach (by default close) our end of ``link``; nothing if it is already going."""
        if not self.engine.closed:
            self.engine.detach(link, closed=closed, error=error)
            self.kick()

    def answer_attach(
        self,
        link: Link,
        *,
        source: Source | None = None,
        target: Target | None = None,
        **attach: Any,
    ) -> None:
        """Answer a peer's attach with our own (by default mirroring its termini)."""
        self.engine.answer_attach(
            link,
            source=link.remote_source if source is None else source,
            target=link.remote_target if target is None else target,
            **attach,
        )
        self.kick()

    def attach(self, *, role: bool, session: Session | None = None, **attach: Any) -> Link:
        """Attach a link of ours (frames go out at once, no waiting): ``name``, ``source``,
        ``target`` and the rest as :meth:`Connection.attach` takes them."""
        link = self.engine.attach(session or self.session, role=role, **attach)
        self.kick()
        return link

    def begin(self) -> Session | None:
        """Begin one more session (pipelined, no wait), for links past what one session's
        handles hold; None when the channel-max of either end allows no more here."""
        self.raise_if_closed()
        try:
            session = self.engine.begin()
        except LocalProtocolError as exc:
            if exc.condition != conditions.RESOURCE_LIMIT_EXCEEDED:  # closing: no new session
                raise ConnectionLostError(f"cannot begin a session: {exc.description}") from None
            return None
        self.kick()
        return session

    async def wait_begun(self, session: Session) -> None:
        """Wait for the peer's begin answering ``session``. A pipelined transfer must not
        reach a session the peer has not set up yet: Proton, whose application begins a
        session only after reading the whole burst, closes the connection with
        window-violation. ``ConnectionLostError`` if the connection or the session ends."""
        while session.state is SessionState.BEGIN_SENT:
            self.raise_if_closed()
            waiter = self._session_waiters.get(session)
            if waiter is None:
                waiter = self._session_waiters[session] = trio.Event()
            await waiter.wait()
        self.raise_if_closed()
        if session.state is not SessionState.MAPPED:
            raise ConnectionLostError("the peer ended the session")

    @property
    def remote_offered_capabilities(self) -> list[str]:
        return self.engine.remote_offered_capabilities

    @property
    def sasl_identity(self) -> str | None:
        """Who the peer authenticated as (SASL PLAIN user, EXTERNAL identity), if anyone."""
        return self.engine.sasl_identity

    def _link_open(self, link: Link) -> bool:
        return not self.engine.closed and link.state in _LINK_OPEN

    # -- links -----------------------------------------------------------------------------

    @property
    def session(self) -> Session:
        """The connection's default session, begun on first use (pipelined, no wait)."""
        if self._session is None:
            self.raise_if_closed()
            self._session = self.engine.begin()
            self.kick()
        return self._session

    def link_name(self, prefix: str) -> str:
        return f"{prefix}-{self.engine.config.container_id}-{next(self._names)}"

    def refuse(
        self,
        link: Link,
        error: Error,
        *,
        null_terminus: bool = True,
        properties: dict[Any, Any] | None = None,
    ) -> None:
        """Refuse a peer's link: a null terminus (the link was never created, §2.6.3), or
        an attach mirroring the peer's with ``properties`` (it was created, then found
        wanting); either way followed by a closing detach carrying ``error``."""
        if null_terminus:
            self.engine.refuse_attach(link, error)
            self.kick()
        else:
            self.answer_attach(link, properties=properties)
            self.detach(link, error=error)


_HANDLERS: dict[type, Callable[[AmqpConnection, Any], None]] = {
    SaslDone: AmqpConnection._on_sasl,
    ConnectionOpened: AmqpConnection._on_opened,
    ConnectionClosed: AmqpConnection._on_closed,
    ProtocolViolation: AmqpConnection._on_violation,
    TransportFailed: AmqpConnection._on_transport_failed,
    LinkAttachRequested: AmqpConnection._on_attach_requested,
    LinkAttached: link_events.attached,
    LinkFlow: link_events.flowed,
    MessageReceived: link_events.received,
    DeliveryUpdated: link_events.updated,
    LinkDetached: link_events.detached,
    SessionBegun: AmqpConnection._on_session_begun,
    SessionEnded: AmqpConnection._on_session_ended,
}
