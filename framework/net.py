"""Where connections come from: ``amqp[s]://`` URLs, ``connect`` and ``listen`` over TCP or
TLS, and the limits a listener keeps (handshake time, connections at once, failed logins).

Both hand each socket to :func:`open_connection`, which runs an
:class:`~framework.transport.AmqpConnection` over it (or over any other Trio stream).
"""

from __future__ import annotations

import contextlib
import resource
import ssl
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs
import structlog
import trio

from framework.amqp.connection import ConnectionConfig
from framework.amqp.sasl import EXTERNAL, SaslClient, SaslServer
from framework.errors import AuthenticationError, ConnectionLostError
from framework.login_throttle import LoginThrottle
from framework.taskgroups import body_errors_unwrapped
from framework.transport import MAX_OUTGOING_BYTES, AmqpConnection, OnAttach

log = structlog.get_logger("pairlink.transport")

AMQP_PORT = 5672
AMQPS_PORT = 5671
HANDSHAKE_TIMEOUT = 10.0
"""Seconds a listener gives a new connection to finish its handshake (TLS, protocol header,
SASL, open); one that has not by then is dropped, so silent sockets cannot pile up."""

CONNECT_FAILURES = (OSError, trio.BrokenResourceError, trio.TooSlowError, ConnectionLostError)
"""What ``connect`` (or a connection it made) may fail with that another attempt may not:
network trouble, a timeout, a failed TLS handshake, a lost connection (``AuthenticationError``
is one too: wrong credentials stay wrong, so callers that retry check for it first)."""


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


@asynccontextmanager
async def open_connection(
    stream: trio.abc.Stream,
    config: ConnectionConfig,
    *,
    initiator: bool,
    peer: str = "?",
    on_attach: OnAttach | None = None,
    max_outgoing_bytes: int = MAX_OUTGOING_BYTES,
) -> AsyncIterator[AmqpConnection]:
    """Run AMQP over any Trio stream; closes it (and the stream) when the block ends."""
    conn = AmqpConnection(
        stream,
        config,
        initiator=initiator,
        peer=peer,
        on_attach=on_attach,
        max_outgoing_bytes=max_outgoing_bytes,
    )
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
    max_outgoing_bytes: int = MAX_OUTGOING_BYTES,
    **config: Any,
) -> AsyncIterator[AmqpConnection]:
    """Connect to ``amqp[s]://[user:password@]host[:port]``; SASL PLAIN when the URL has a
    user, ANONYMOUS otherwise. The open is pipelined: use ``wait_opened()`` to wait for it.
    ``config``: ``ConnectionConfig`` fields (``idle_timeout``, the engine's limits...)."""
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
        stream,
        client_config(parsed, **config),
        initiator=True,
        peer=peer,
        on_attach=on_attach,
        max_outgoing_bytes=max_outgoing_bytes,
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
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    max_connections: int | None = None,
    max_outgoing_bytes: int = MAX_OUTGOING_BYTES,
    login_throttle: LoginThrottle | None = None,
    certificate_users: Collection[str] | None = None,
    **config: Any,
) -> AsyncIterator[Listener]:
    """Accept AMQP connections on ``amqp[s]://host:port`` (port 0 picks a free one).

    ``users`` enables SASL PLAIN against that table (ANONYMOUS then only if
    ``allow_anonymous``); a client certificate that ``ssl_context`` verified logs its peer in
    with SASL EXTERNAL as its common name (else its first subjectAltName), only when that
    name is one of ``certificate_users`` if given. ``on_attach`` answers the links peers
    open; ``handler`` runs for each connection's lifetime. Leaving the block closes every
    connection.

    Limits: a connection that has not finished its handshake (TLS, header, SASL, open) within
    ``handshake_timeout`` seconds is dropped; past ``max_connections`` at once (default
    :func:`default_max_connections`) a new connection is closed as soon as it is accepted;
    ``max_outgoing_bytes`` bounds what each connection holds for a peer that does not read.
    After a refused login, new connections from that peer address are served one at a time,
    ``login_throttle.penalty`` seconds apart (:mod:`framework.login_throttle`).
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
                on_attach=on_attach,
                max_outgoing_bytes=max_outgoing_bytes,
            ) as conn:
                listener.connections.add(conn)
                try:
                    with trio.move_on_at(deadline), contextlib.suppress(ConnectionLostError):
                        await conn.wait_opened()
                    handshaking.pop(scope, None)  # done, one way or the other
                    if isinstance(conn.error, AuthenticationError):
                        throttle.failed(host, trio.current_time())
                    elif conn.sasl_identity not in (None, "anonymous"):
                        throttle.succeeded(host)
                    if not conn.opened.is_set():
                        if not conn.closed.is_set():
                            conn.log.info("connection.handshake_timeout", after=handshake_timeout)
                            conn.abort(ConnectionLostError("no handshake in time"))
                        return
                    if handler is not None:
                        await handler(conn)
                    await conn.closed.wait()
                finally:
                    listener.connections.discard(conn)
        except (trio.BrokenResourceError, ssl.SSLError, trio.TooSlowError) as exc:
            log.info("connection.dropped", peer=peer, error=repr(exc))
        except Exception as exc:  # backstop: one connection's failure never ends the listener
            log.error("connection.crashed", peer=peer, exc_info=exc)

    async def accept(stream: trio.SocketStream) -> None:
        nonlocal active
        host, port_, *_ = stream.socket.getpeername()
        peer = f"{host}:{port_}"
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


def default_max_connections() -> int:
    """Three quarters of the process's open-file limit: what a listener accepts at once by
    default, so that a flood of connections always leaves descriptors for the process's own
    upstream connections, files and a second listener."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return max(16, soft * 3 // 4)


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
