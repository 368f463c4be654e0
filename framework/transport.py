"""The Trio layer under the AMQP engine: sockets, TLS, time and tasks, nothing about the protocol.

Each connection runs three tasks in its own nursery: one reader (bytes -> engine -> events),
one writer (everything the engine queued since the last send goes out in one ``send_all``, so a
burst of frames costs one system call), and one timer (heartbeats, idle timeout). Leaving the
``connect``/``listen`` context, cleanly or by cancellation, closes the connection and the
socket and leaves no task behind. Network failures never escape a background task: they fail
the operations waiting on that connection with ``ConnectionLostError``.
"""

from __future__ import annotations

import itertools
import math
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs
import structlog
import trio

from framework.amqp.connection import Connection, ConnectionConfig
from framework.amqp.events import (
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
    SessionEnded,
    TransportFailed,
)
from framework.amqp.link import Link
from framework.amqp.messaging import Error, Source, Target
from framework.amqp.performatives import RCV_FIRST, ROLE_RECEIVER, ROLE_SENDER, SND_MIXED
from framework.amqp.sasl import EXTERNAL, SaslClient, SaslServer
from framework.amqp.session import Session
from framework.endpoints import Endpoint, Receiver, Sender
from framework.errors import AuthenticationError, ConnectionLostError, LinkDetachedError
from framework.taskgroups import body_errors_unwrapped

log = structlog.get_logger("pairlink.transport")

AMQP_PORT = 5672
AMQPS_PORT = 5671
READ_SIZE = 1 << 16
FEED_SLICE = 1 << 12
"""The engine is fed at most this many bytes at a time; between slices the writer gets its
turn if the engine has replies to send. A 64 KiB read can hold hundreds of small calls: fed
whole, the peer waited for all of them to be answered before it saw the first reply, and the
two processes never worked at the same time (measured: ~1.6x the throughput with 4 KiB
slices; 8 KiB and more lose most of it, 2 KiB gains nothing more)."""
HANDSHAKE_TIMEOUT = 30.0
_NETWORK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError)
_conn_ids = itertools.count(1)

CONNECT_FAILURES = (OSError, trio.BrokenResourceError, trio.TooSlowError, ConnectionLostError)
"""What ``connect`` (or a connection it made) may fail with that another attempt may not:
network trouble, a timeout, a failed TLS handshake, a lost connection (``AuthenticationError``
is one too: wrong credentials stay wrong, so callers that retry check for it first)."""

OnAttach = Callable[["AmqpConnection", Link], None]
"""Called for each link the peer opens; must answer it (``accept_*``) or ``refuse`` it."""


@attrs.frozen
class AmqpUrl:
    """``amqp[s]://[user:password@]host[:port]`` split into what a connection needs."""

    scheme: str
    host: str
    port: int
    username: str | None = None
    password: str | None = None

    @property
    def tls(self) -> bool:
        return self.scheme == "amqps"

    @classmethod
    def parse(cls, url: str) -> AmqpUrl:
        parts = urlsplit(url)
        if parts.scheme not in ("amqp", "amqps"):
            raise ValueError(f"{url!r}: the scheme must be amqp or amqps")
        if not parts.hostname:
            raise ValueError(f"{url!r}: no host")
        default = AMQPS_PORT if parts.scheme == "amqps" else AMQP_PORT
        return cls(
            parts.scheme,
            parts.hostname,
            parts.port if parts.port is not None else default,
            unquote(parts.username) if parts.username else None,
            unquote(parts.password) if parts.password else None,
        )


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
        self._names = itertools.count(1)
        self._input_hold: trio.Event | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def _run(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._read_loop)
        nursery.start_soon(self._write_loop)
        nursery.start_soon(self._timer_loop)

    def kick(self) -> None:
        """Wake the writer: whatever the engine queued goes out in its next send. Called
        several times per call; once a wake-up is pending, it carries these bytes too."""
        if self._kicked:
            return
        self._kicked = True
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
        for session in list(self.engine.sessions.values()):
            for link in list(session.links.values()):
                self._wake_link(link)

    @staticmethod
    def _wake_link(link: Link) -> None:
        endpoint = link.user_data
        if isinstance(endpoint, Endpoint):
            endpoint.link_ended()

    # -- tasks -----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        """Read until the peer's EOF, even after the engine is done: draining what the peer
        still sends lets our close end in a FIN, not a reset that could destroy our last
        frames (a SASL outcome, a close) before the peer reads them."""
        engine = self.engine
        try:
            while True:
                try:
                    data = await self.stream.receive_some(READ_SIZE)
                except _NETWORK_ERRORS as exc:
                    self._dispatch(engine.connection_lost(), lost=f"read failed: {exc!r}")
                    return
                if not data:
                    self._dispatch(engine.connection_lost(), lost="the peer closed the socket")
                    return
                await self._feed_sliced(data)
        finally:
            self._eof.set()

    async def _feed_sliced(self, data: bytes | bytearray) -> None:
        """Feed a read in ``FEED_SLICE`` pieces, letting the writer send what each piece's
        calls produced before the next is decoded (a large message's bytes alone yield
        nothing to send, so they cost no extra task switch)."""
        if len(data) <= FEED_SLICE:
            if self._feed(data):
                await self._resume_held()
            return
        view = memoryview(data)
        for start in range(0, len(view), FEED_SLICE):
            if start and self.engine.has_output:
                await trio.lowlevel.checkpoint()
            if self._feed(view[start : start + FEED_SLICE]):
                await self._resume_held()

    def _feed(self, data: bytes | bytearray | memoryview) -> bool:
        """Hand bytes to the engine and dispatch what they meant; True when an ``on_attach``
        held the input (``hold_input``), with bytes still waiting in the engine."""
        engine = self.engine
        events = engine.receive_data(data)
        while True:
            self._dispatch(events)
            if not engine.input_paused:
                break
            if self._input_hold is not None:
                self.kick()
                return True
            events = engine.receive_data(b"")
        self.kick()
        return False

    async def _resume_held(self) -> None:
        while self._input_hold is not None:
            await self._input_hold.wait()
            self._input_hold = None
            if self._feed(b""):
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
                done = engine.transport_done
                data = engine.data_to_send()
                if data:
                    try:
                        await self.stream.send_all(data)
                    except _NETWORK_ERRORS as exc:
                        self._dispatch(engine.connection_lost(), lost=f"write failed: {exc!r}")
                        return
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
            self._dispatch(engine.tick(trio.current_time()))
            self.kick()
            deadline = engine.next_deadline
            self._timer_kick = trio.Event()
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await self._timer_kick.wait()

    # -- events ----------------------------------------------------------------------------

    def _dispatch(self, events: list[Event], lost: str | None = None) -> None:
        for event in events:
            handler = _HANDLERS.get(type(event))
            if handler is not None:
                handler(self, event)
        if lost is not None:
            self._finish(self.error or ConnectionLostError(lost))

    def _on_sasl(self, event: SaslDone) -> None:
        if event.outcome != 0:
            self.error = AuthenticationError(
                f"SASL {event.mechanism} refused (code {event.outcome})", "amqp:unauthorized-access"
            )
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
        self.log.warning("protocol.violation", condition=event.condition, why=event.description)
        self.error = ConnectionLostError(event.description, event.condition)

    def _on_transport_failed(self, event: TransportFailed) -> None:
        self._finish(self.error or ConnectionLostError(event.reason))

    def _on_attach_requested(self, event: LinkAttachRequested) -> None:
        link = event.link
        self.log.debug("link.requested", name=link.name, role=link.role)
        if self.on_attach is None:
            self.refuse(
                link,
                Error(condition="amqp:not-allowed", description="this container accepts no links"),
            )
        else:
            self.on_attach(self, link)
        self.kick()

    def _on_attached(self, event: LinkAttached) -> None:
        endpoint = event.link.user_data
        if isinstance(endpoint, Endpoint):
            endpoint.attached.set()
            endpoint.on_attached()

    def _on_flow(self, event: LinkFlow) -> None:
        endpoint = event.link.user_data
        if isinstance(endpoint, Endpoint):
            endpoint.on_flow()

    def _on_message(self, event: MessageReceived) -> None:
        endpoint = event.link.user_data
        if isinstance(endpoint, Endpoint):
            endpoint.on_message(event.delivery, event.payload)

    def _on_update(self, event: DeliveryUpdated) -> None:
        endpoint = event.link.user_data
        if isinstance(endpoint, Endpoint):
            endpoint.on_update(event.delivery)

    def _on_detached(self, event: LinkDetached) -> None:
        endpoint = event.link.user_data
        if isinstance(endpoint, Endpoint):
            endpoint.link_ended(
                LinkDetachedError.from_amqp(event.error, f"link {event.link.name!r} detached")
            )

    def _on_session_ended(self, event: SessionEnded) -> None:
        if event.session is self._session:
            self._session = None

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

    def open_sender(
        self,
        address: str | None,
        *,
        name: str | None = None,
        source_address: str | None = None,
        properties: dict[Any, Any] | None = None,
        snd_settle_mode: int = SND_MIXED,
        rcv_settle_mode: int = RCV_FIRST,
        session: Session | None = None,
    ) -> Sender:
        """Attach a sending link to ``address``; frames go out at once, no waiting."""
        link = self.engine.attach(
            session or self.session,
            name=name or self.link_name("sender"),
            role=ROLE_SENDER,
            source=Source(address=source_address),
            target=Target(address=address),
            snd_settle_mode=snd_settle_mode,
            rcv_settle_mode=rcv_settle_mode,
            properties=properties,
        )
        self.kick()
        return Sender(self, link)

    def open_receiver(
        self,
        address: str | None,
        *,
        credit: int = 100,
        name: str | None = None,
        target_address: str | None = None,
        dynamic: bool = False,
        properties: dict[Any, Any] | None = None,
        rcv_settle_mode: int = RCV_FIRST,
        session: Session | None = None,
    ) -> Receiver:
        """Attach a receiving link from ``address`` and grant it ``credit`` at once."""
        link = self.engine.attach(
            session or self.session,
            name=name or self.link_name("receiver"),
            role=ROLE_RECEIVER,
            source=Source(address=address, dynamic=dynamic),
            target=Target(address=target_address),
            rcv_settle_mode=rcv_settle_mode,
            properties=properties,
        )
        receiver = Receiver(self, link, credit)
        receiver.grant()
        return receiver

    def accept_receiver(self, link: Link, *, credit: int = 100, **attach: Any) -> Receiver:
        """Answer a peer's sending link: we receive on it, holding ``credit`` at most."""
        self.engine.answer_attach(
            link, source=link.remote_source, target=link.remote_target, **attach
        )
        receiver = Receiver(self, link, credit)
        receiver.attached.set()
        receiver.grant()
        return receiver

    def accept_sender(self, link: Link, **attach: Any) -> Sender:
        """Answer a peer's receiving link: we send on it as its credit allows."""
        self.engine.answer_attach(
            link, source=link.remote_source, target=link.remote_target, **attach
        )
        self.kick()
        sender = Sender(self, link)
        sender.attached.set()
        return sender

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
        else:
            self.engine.answer_attach(
                link, source=link.remote_source, target=link.remote_target, properties=properties
            )
            self.engine.detach(link, closed=True, error=error)
        self.kick()


_HANDLERS: dict[type, Callable[[AmqpConnection, Any], None]] = {
    SaslDone: AmqpConnection._on_sasl,
    ConnectionOpened: AmqpConnection._on_opened,
    ConnectionClosed: AmqpConnection._on_closed,
    ProtocolViolation: AmqpConnection._on_violation,
    TransportFailed: AmqpConnection._on_transport_failed,
    LinkAttachRequested: AmqpConnection._on_attach_requested,
    LinkAttached: AmqpConnection._on_attached,
    LinkFlow: AmqpConnection._on_flow,
    MessageReceived: AmqpConnection._on_message,
    DeliveryUpdated: AmqpConnection._on_update,
    LinkDetached: AmqpConnection._on_detached,
    SessionEnded: AmqpConnection._on_session_ended,
}


@asynccontextmanager
async def open_connection(
    stream: trio.abc.Stream,
    config: ConnectionConfig,
    *,
    initiator: bool,
    peer: str = "?",
    on_attach: OnAttach | None = None,
) -> AsyncIterator[AmqpConnection]:
    """Run AMQP over any Trio stream; closes it (and the stream) when the block ends."""
    conn = AmqpConnection(stream, config, initiator=initiator, peer=peer, on_attach=on_attach)
    conn.log.info("connection.start", initiator=initiator)
    with body_errors_unwrapped() as body:
        try:
            async with trio.open_nursery() as nursery:
                await conn._run(nursery)
                if initiator:
                    conn.engine.open()
                    conn.kick()
                try:
                    async with body:
                        yield conn
                    await conn.close()
                finally:
                    if conn.closed.is_set():  # let the writer say its last words (bounded)
                        with trio.move_on_after(1, shield=True):
                            await conn.flushed.wait()
                    nursery.cancel_scope.cancel()
        finally:
            conn._finish(conn.error)
            await trio.aclose_forcefully(stream)


def client_config(
    url: AmqpUrl,
    *,
    container_id: str | None = None,
    idle_timeout: float | None = 60.0,
    sasl: bool | str = True,
    **extra: Any,
) -> ConnectionConfig:
    """Our client's engine settings for ``url``.

    ``sasl``: True picks PLAIN when the URL has a user, else ANONYMOUS; "EXTERNAL" lets the
    TLS client certificate speak for us; False skips the SASL layer.
    """
    client: SaslClient | None = None
    if sasl == EXTERNAL:
        client = SaslClient.external()
    elif url.username and sasl:
        client = SaslClient.plain(url.username, url.password or "")
    elif sasl:
        client = SaslClient.anonymous()
    if client is not None:
        client.hostname = url.host
    return ConnectionConfig(
        container_id=container_id or f"pairlink-{uuid.uuid4()}",
        hostname=url.host,
        idle_timeout=idle_timeout,
        sasl=client,
        **extra,
    )


@asynccontextmanager
async def connect(
    url: str,
    *,
    ssl_context: ssl.SSLContext | None = None,
    on_attach: OnAttach | None = None,
    connect_timeout: float = 30.0,
    **config: Any,
) -> AsyncIterator[AmqpConnection]:
    """Connect to ``amqp[s]://[user:password@]host[:port]``; SASL PLAIN when the URL has a
    user, ANONYMOUS otherwise. The open is pipelined: use ``wait_opened()`` to wait for it."""
    parsed = AmqpUrl.parse(url)
    peer = f"{parsed.host}:{parsed.port}"
    with trio.fail_after(connect_timeout):
        stream: trio.abc.Stream = await trio.open_tcp_stream(parsed.host, parsed.port)
    if parsed.tls:
        context = ssl_context or ssl.create_default_context()
        stream = trio.SSLStream(stream, context, server_hostname=parsed.host)
        try:
            with trio.fail_after(connect_timeout):
                await stream.do_handshake()
        except BaseException as exc:
            await trio.aclose_forcefully(stream)
            if isinstance(exc, trio.BrokenResourceError):  # say why: the ssl error it wraps
                why = exc.__cause__ or exc
                raise ConnectionLostError(f"TLS handshake with {peer} failed: {why}") from exc
            raise
    async with open_connection(
        stream, client_config(parsed, **config), initiator=True, peer=peer, on_attach=on_attach
    ) as conn:
        yield conn


@attrs.define
class Listener:
    """A running listener: where it listens, and its connections."""

    url: str
    port: int
    connections: set[AmqpConnection] = attrs.field(factory=set)


@asynccontextmanager
async def listen(
    url: str,
    *,
    on_attach: OnAttach | None = None,
    handler: Callable[[AmqpConnection], Awaitable[None]] | None = None,
    users: dict[str, str] | None = None,
    allow_anonymous: bool | None = None,
    ssl_context: ssl.SSLContext | None = None,
    container_id: str | None = None,
    idle_timeout: float | None = 60.0,
    offered_capabilities: Sequence[str] = (),
    **config: Any,
) -> AsyncIterator[Listener]:
    """Accept AMQP connections on ``amqp[s]://host:port`` (port 0 picks a free one).

    ``users`` enables SASL PLAIN against that table (ANONYMOUS then only if
    ``allow_anonymous``); ``on_attach`` answers the links peers open; ``handler`` runs for
    each connection's lifetime. Leaving the block closes every connection.
    """
    parsed = AmqpUrl.parse(url)
    if parsed.tls and ssl_context is None:
        raise ValueError("amqps:// needs an ssl_context with the server certificate")
    anonymous = users is None if allow_anonymous is None else allow_anonymous
    sasl = SaslServer.with_users(users or {}, allow_anonymous=anonymous)
    listeners = await trio.open_tcp_listeners(parsed.port, host=parsed.host)
    port = listeners[0].socket.getsockname()[1]
    scheme_url = f"{parsed.scheme}://{parsed.host}:{port}"
    listener = Listener(scheme_url, port)
    name = container_id or f"pairlink-{uuid.uuid4()}"

    async def serve_one(stream: trio.abc.Stream, peer: str) -> None:
        external: str | None = None
        try:
            if ssl_context is not None:
                tls = trio.SSLStream(stream, ssl_context, server_side=True)
                with trio.fail_after(HANDSHAKE_TIMEOUT):
                    await tls.do_handshake()
                external = _certificate_identity(tls.getpeercert())
                stream = tls
            cfg = ConnectionConfig(
                container_id=name,
                idle_timeout=idle_timeout,
                offered_capabilities=offered_capabilities,
                sasl=attrs.evolve(sasl, external_identity=external),
                **config,
            )
            async with open_connection(
                stream, cfg, initiator=False, peer=peer, on_attach=on_attach
            ) as conn:
                listener.connections.add(conn)
                try:
                    if handler is not None:
                        await handler(conn)
                    await conn.closed.wait()
                finally:
                    listener.connections.discard(conn)
        except (trio.BrokenResourceError, ssl.SSLError, trio.TooSlowError) as exc:
            log.info("connection.dropped", peer=peer, error=repr(exc))

    async def accept(stream: trio.SocketStream) -> None:
        host, port_, *_ = stream.socket.getpeername()
        await serve_one(stream, f"{host}:{port_}")

    log.info("listener.start", url=scheme_url)
    with body_errors_unwrapped() as body:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, accept, listeners)
            try:
                async with body:
                    yield listener
            finally:
                for conn in list(listener.connections):
                    with trio.move_on_after(2):
                        await conn.close()
                nursery.cancel_scope.cancel()


def _certificate_identity(cert: Any) -> str | None:
    """The SASL EXTERNAL identity of a verified client certificate: its commonName, else its
    first subjectAltName."""
    cert = cert or {}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    for _kind, value in cert.get("subjectAltName", ()):
        return str(value)
    return None
