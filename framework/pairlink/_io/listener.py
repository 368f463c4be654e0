"""Listening: ``listen`` accepts AMQP connections over TCP or TLS, keeps the limits a
listener owes its process (handshake time, connections at once, failed logins), and gives
each open connection a handler of the caller's making (:class:`ConnectionHandler`).

The handler is the one place the layers above keep per-connection state (the server's
reply routes, the gateway's relayed pairs): the listener makes it once the connection is
open, before the connection's first attach is answered, routes that connection's attaches
to it, and tells it once when the connection ends, so neither servers nor gateways track
connections themselves.

A listener serves any Trio byte stream the same way (:meth:`Listener.serve_stream`), and
:meth:`Listener.open_stream` connects to it over an in-memory one: a listener made with no URL
opens no socket at all, for tests (:mod:`pairlink.testing`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import resource
import ssl
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from typing import Generic, Protocol, TypedDict, TypeVar, Unpack

import attrs
import trio
import trio.testing

from pairlink._amqp.connection import ConnectionConfig
from pairlink._amqp.link import Link
from pairlink._amqp.sasl import ANONYMOUS_IDENTITY, SaslServer
from pairlink._io.connection import AmqpConnection
from pairlink._io.login_throttle import LoginThrottle
from pairlink._io.net import AmqpUrl, EngineOptions, open_connection
from pairlink._io.taskgroups import body_errors_unwrapped
from pairlink._io.writes import MAX_OUTGOING_BYTES
from pairlink._telemetry.logs import get_logger
from pairlink.errors import AuthenticationError, ConnectionLostError

log = get_logger("pairlink.transport")

IN_MEMORY_URL = "amqp://in-memory"
"""The URL of a listener that opens no socket: what its clients give ``connect`` beside the
listener's :meth:`~Listener.open_stream` (the host is only named in their open and SASL)."""

HANDSHAKE_TIMEOUT = 10.0
"""Seconds a listener gives a new connection to finish its handshake (TLS, protocol header,
SASL, open); one that has not by then is dropped, so silent sockets cannot pile up."""


class ConnectionHandler(Protocol):
    """What a listener's ``accept`` makes of each open connection: the owner of that
    connection's links, told of each link the peer opens and of the connection's end."""

    def on_attach(self, link: Link) -> None:
        """The peer opens ``link``: answer it (``accept_*``, ``answer_attach``) or refuse it."""

    def on_closed(self) -> None:
        """The connection is over (said once): forget what was kept for it."""


H = TypeVar("H", bound=ConnectionHandler)


@attrs.define
class Listener(Generic[H]):
    """A running listener: where it listens, its connections, and the handler of each open
    one (by connection, from ``accept``)."""

    url: str
    port: int
    """The port listened on; 0 for a listener that opens no socket."""
    _accept: Callable[[AmqpConnection], H]
    _admit: Callable[[trio.abc.Stream, str, str], Awaitable[None]]
    """Serves one stream (from ``host``, as ``peer``) with the listener's limits."""
    _nursery: trio.Nursery
    connections: set[AmqpConnection] = attrs.field(factory=set)
    """Every connection, those still in their handshake too."""
    handlers: dict[AmqpConnection, H] = attrs.field(factory=dict)
    """The open connections' handlers, until each has been told ``on_closed``."""
    _in_memory: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))

    async def serve_stream(self, stream: trio.abc.Stream, *, peer: str, host: str = "") -> None:
        """Serve one AMQP connection over ``stream`` until it ends, as if the listener had
        accepted it: the same limits, handshake, SASL and handler (``host``, default ``peer``,
        is the address failed logins are counted against). Closes the stream."""
        await self._admit(stream, host or peer, peer)

    async def open_stream(self) -> trio.abc.Stream:
        """A new connection to this listener over an in-memory stream, no socket: the end
        to speak AMQP over (a :data:`pairlink._io.net.Connector` for ``connect``); the other
        end is served in the listener's task group until either side closes.
        ``ConnectionLostError`` once the listener has closed, as a refused connection."""
        await trio.lowlevel.checkpoint()
        ours, theirs = trio.testing.memory_stream_pair()
        peer = f"memory-{next(self._in_memory)}"
        try:
            self._nursery.start_soon(functools.partial(self.serve_stream, theirs, peer=peer))
        except RuntimeError:  # the nursery is closed to new arrivals
            raise ConnectionLostError(f"{self.url}: the listener has closed") from None
        return ours

    def on_attach(self, conn: AmqpConnection, link: Link) -> None:
        """The ``OnAttach`` the listener gives each of its connections: ``link`` goes to the
        connection's handler."""
        handler = self._handler(conn)
        if handler is not None:
            handler.on_attach(link)

    def _handler(self, conn: AmqpConnection) -> H | None:
        """``conn``'s handler, made at its first call: when the open arrived, or at the first
        attach if that came in the same read (LP-10). None once the connection is over: an
        attach still read after our close needs no answer."""
        handler = self.handlers.get(conn)
        if handler is None and not conn.closed.is_set():
            handler = self.handlers[conn] = self._accept(conn)
        return handler

    async def _serve_open(self, conn: AmqpConnection) -> None:
        """For an open connection's lifetime: its handler exists, and hears of its end."""
        self._handler(conn)
        try:
            await conn.closed.wait()
        finally:  # cancelled too: leaving ``listen`` tells every handler
            handler = self.handlers.pop(conn, None)
            if handler is not None:
                handler.on_closed()


@asynccontextmanager
async def listen(
    url: str | None,
    *,
    accept: Callable[[AmqpConnection], H],
    users: dict[str, str] | None = None,
    allow_anonymous: bool | None = None,
    ssl_context: ssl.SSLContext | None = None,
    container_id: str | None = None,
    idle_timeout: float | None = 60.0,
    offered_capabilities: Sequence[str] = (),
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    max_connections: int | None = None,
    max_outgoing_bytes: int = MAX_OUTGOING_BYTES,
    login_throttle: LoginThrottle | None = None,
    certificate_users: Collection[str] | None = None,
    reuse_port: bool = False,
    **config: Unpack[EngineOptions],
) -> AsyncIterator[Listener[H]]:
    """Accept AMQP connections on ``amqp[s]://host:port`` (port 0 picks a free one); with
    no ``url``, only those made by :meth:`Listener.open_stream` (or given to
    :meth:`Listener.serve_stream`), no socket opened.

    ``accept`` makes the :class:`ConnectionHandler` of each connection once it is open (its
    SASL identity known); the handler answers every link the peer opens and hears
    ``on_closed`` once when the connection ends. Leaving the block closes every connection
    (each handler is told before it returns).

    ``users`` enables SASL PLAIN against that table; a client certificate that
    ``ssl_context`` verified logs its peer in with SASL EXTERNAL as its common name (else its
    first subjectAltName), only when that name is one of ``certificate_users`` if given.
    Anonymous peers (``allow_anonymous``, by default only when there are neither ``users``
    nor ``certificate_users``) may say SASL ANONYMOUS or skip SASL, opening with the
    plain AMQP header (over TLS too); a listener that requires users answers that header
    with the SASL one and hangs up (AMQP 1.0 §2.2).

    Limits: a connection that has not finished its handshake (TLS, header, SASL, open) within
    ``handshake_timeout`` seconds is dropped; past ``max_connections`` at once (default
    :func:`default_max_connections`) a new connection is closed as soon as it is accepted;
    ``max_outgoing_bytes`` bounds what each connection holds for a peer that does not read.
    After a refused login, new connections from that peer address are served one at a time,
    ``login_throttle.penalty`` seconds apart (:mod:`pairlink._io.login_throttle`).

    ``reuse_port`` binds with ``SO_REUSEPORT`` (:func:`bind_reuse_port`): processes that
    listen on the same port so share its connections (``pairlink serve --workers``).
    ``config``: the engine's settings (:class:`EngineOptions`).
    """
    parsed = None if url is None else AmqpUrl.parse(url)
    if parsed is not None and parsed.tls and ssl_context is None:
        raise ValueError("amqps:// needs an ssl_context with the server certificate")
    if allow_anonymous is None:
        allow_anonymous = users is None and not certificate_users
    sasl = SaslServer.with_users(users or {}, allow_anonymous=allow_anonymous)
    listeners: list[trio.SocketListener] = []
    port, scheme_url = 0, IN_MEMORY_URL
    if parsed is not None:
        if reuse_port:
            for sock in await bind_reuse_port(parsed.host, parsed.port):
                sock.listen(trio.socket.SOMAXCONN)
                listeners.append(trio.SocketListener(sock))
        else:
            listeners = await trio.open_tcp_listeners(parsed.port, host=parsed.host)
        port = listeners[0].socket.getsockname()[1]
        scheme_url = f"{parsed.scheme}://{parsed.host}:{port}"
    name = container_id or f"pairlink-{uuid.uuid4()}"
    limit = default_max_connections() if max_connections is None else max_connections
    active = 0
    throttle = LoginThrottle() if login_throttle is None else login_throttle
    # connections still in their handshake, oldest first: the first to go when we are full
    handshaking: OrderedDict[trio.CancelScope, None] = OrderedDict()

    async def serve_one(
        stream: trio.abc.Stream, host: str, peer: str, scope: trio.CancelScope
    ) -> None:
        external: str | None = None
        deadline = trio.current_time() + handshake_timeout
        try:
            if ssl_context is not None:
                tls = trio.SSLStream(stream, ssl_context, server_side=True)
                with trio.fail_at(deadline):
                    await tls.do_handshake()
                external = _certificate_identity(tls.getpeercert())
                if certificate_users is not None and external not in certificate_users:
                    external = None  # a certificate of nobody we know: no EXTERNAL login
                stream = tls
            cfg = ConnectionConfig(
                container_id=name,
                idle_timeout=idle_timeout,
                offered_capabilities=offered_capabilities,
                sasl=attrs.evolve(sasl, external_identity=external),
                **config,
            )
            async with open_connection(
                stream,
                cfg,
                initiator=False,
                peer=peer,
                on_attach=listener.on_attach,
                max_outgoing_bytes=max_outgoing_bytes,
            ) as conn:
                listener.connections.add(conn)
                try:
                    with trio.move_on_at(deadline), contextlib.suppress(ConnectionLostError):
                        await conn.wait_opened()
                    handshaking.pop(scope, None)  # done, one way or the other
                    if isinstance(conn.error, AuthenticationError):
                        throttle.failed(host, trio.current_time())
                    elif conn.sasl_identity not in (None, ANONYMOUS_IDENTITY):
                        throttle.succeeded(host)
                    if not conn.opened.is_set():
                        if not conn.closed.is_set():
                            conn.log.info("connection.handshake_timeout", after=handshake_timeout)
                            conn.abort(ConnectionLostError("no handshake in time"))
                        return
                    await listener._serve_open(conn)
                finally:
                    listener.connections.discard(conn)
        except (trio.BrokenResourceError, ssl.SSLError, trio.TooSlowError) as exc:
            log.info("connection.dropped", peer=peer, error=repr(exc))
        except Exception as exc:  # backstop: one connection's failure never ends the listener
            log.error("connection.crashed", peer=peer, exc_info=exc)

    async def admit(stream: trio.abc.Stream, host: str, peer: str) -> None:
        nonlocal active
        if active >= limit:
            if not handshaking:
                log.warning("connection.refused", peer=peer, why="max_connections", limit=limit)
                await trio.aclose_forcefully(stream)
                return
            # full, but not of connections that got anywhere: the oldest of those still in
            # their handshake makes room, so silent sockets cannot lock real clients out
            victim, _ = handshaking.popitem(last=False)
            victim.cancel()
            log.warning("connection.evicted", why="max_connections", limit=limit)
        active += 1
        try:
            with trio.CancelScope() as scope:
                handshaking[scope] = None
                wait = throttle.admit(host, trio.current_time())
                if wait is None:
                    log.warning("connection.refused", peer=peer, why="failed logins")
                    await trio.aclose_forcefully(stream)
                    return
                if wait > 0:  # this address guessed wrong lately: its attempts wait their turn
                    log.info("login.throttled", peer=peer, wait=round(wait, 3))
                    await trio.sleep(wait)
                await serve_one(stream, host, peer, scope)
        finally:
            handshaking.pop(scope, None)
            active -= 1
            await trio.aclose_forcefully(stream)

    async def admit_socket(stream: trio.SocketStream) -> None:
        host, port_, *_ = stream.socket.getpeername()
        await admit(stream, host, f"{host}:{port_}")

    log.info("listener.start", url=scheme_url)
    with body_errors_unwrapped() as body:
        async with trio.open_nursery() as nursery:
            listener = Listener(scheme_url, port, accept, admit, nursery)
            if listeners:
                await nursery.start(trio.serve_listeners, admit_socket, listeners)
            try:
                async with body:
                    yield listener
            finally:
                for conn in list(listener.connections):
                    with trio.move_on_after(2):
                        await conn.close()
                nursery.cancel_scope.cancel()


async def bind_reuse_port(host: str, port: int) -> list[trio.socket.SocketType]:
    """Sockets bound with ``SO_REUSEPORT`` to every address of ``host`` at ``port``, not
    listening yet: processes of one user may all bind a port so, and Linux spreads new
    connections among those of its sockets that listen. With port 0 the first address picks
    a free port and the others take the same one, so one port number stands for them all
    (and a supervisor can hold it, bound but never listening, while its workers listen)."""
    option = getattr(trio.socket, "SO_REUSEPORT", None)
    if option is None:
        raise ValueError("sharing a port needs SO_REUSEPORT, which this system lacks")
    found = await trio.socket.getaddrinfo(
        host, port, type=trio.socket.SOCK_STREAM, flags=trio.socket.AI_PASSIVE
    )
    bound: list[trio.socket.SocketType] = []
    try:
        for family, type_, proto, _, address in found:
            sock = trio.socket.socket(family, type_, proto)
            bound.append(sock)
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
            sock.setsockopt(trio.socket.SOL_SOCKET, option, 1)
            if family == trio.socket.AF_INET6:
                sock.setsockopt(trio.socket.IPPROTO_IPV6, trio.socket.IPV6_V6ONLY, 1)
            await sock.bind((address[0], port, *address[2:]))
            port = sock.getsockname()[1]
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


def default_max_connections() -> int:
    """Three quarters of the process's open-file limit: what a listener accepts at once by
    default, so that a flood of connections always leaves descriptors for the process's own
    upstream connections, files and a second listener."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return max(16, soft * 3 // 4)


class _PeerCert(TypedDict, total=False):
    """What :func:`_certificate_identity` reads of ``SSLSocket.getpeercert()`` (the ssl
    module's documented shape; trio forwards the call untyped)."""

    subject: tuple[tuple[tuple[str, str], ...], ...]
    subjectAltName: tuple[tuple[str, str], ...]


def _certificate_identity(cert: _PeerCert | None) -> str | None:
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
