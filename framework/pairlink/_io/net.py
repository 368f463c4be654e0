"""Where connections come from: ``amqp[s]://`` URLs, and ``connect`` over TCP or TLS.

``connect`` and the listener (:mod:`pairlink._io.listener`) hand each socket to
:func:`open_connection`, which runs an :class:`~pairlink._io.connection.AmqpConnection` over
it (or over any other Trio stream: ``connect`` takes a :data:`Connector` in place of TCP).
"""

from __future__ import annotations

import functools
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TypedDict, Unpack
from urllib.parse import unquote, urlsplit, urlunsplit

import attrs
import trio

from pairlink._amqp.connection import ConnectionConfig
from pairlink._amqp.sasl import EXTERNAL, SaslClient
from pairlink._amqp.types import Fields, Symbol
from pairlink._io.connection import AmqpConnection, OnAttach
from pairlink._io.taskgroups import body_errors_unwrapped
from pairlink._io.writes import MAX_OUTGOING_BYTES
from pairlink._version import VERSION
from pairlink.errors import ConnectionLostError

PRODUCT = "pairlink"
OPEN_PROPERTIES: Fields = {Symbol("product"): PRODUCT, Symbol("version"): VERSION}
"""What every open of ours says about us (clients, servers and gateways alike), under the
keys Qpid and the Azure SDKs use: a peer's logs name us, and a peer that reads ``open``'s
properties field without checking that it is there (azure-eventhub 5.15) finds it."""

AMQP_PORT = 5672
AMQPS_PORT = 5671

Connector = Callable[[], Awaitable[trio.abc.Stream]]
"""Opens the byte stream a client connection runs over, in place of TCP to the URL's host and
port: an in-memory stream to a listener in the same process
(:meth:`pairlink._io.listener.Listener.open_stream`), a Unix socket, a tunnel. Called once per
connection, so a reconnecting client gets a new stream each time."""

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


HIDDEN = "***"
"""What a URL's password is shown as, in errors and logs."""


def redacted(url: str) -> str:
    """``url`` as errors and logs show it: its password, if any, replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:{HIDDEN}@{host}"))


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
    """Run AMQP over any Trio stream; closes it (and the stream) when the block ends. Its
    open carries ``OPEN_PROPERTIES`` beside the properties ``config`` gives."""
    properties = {**OPEN_PROPERTIES, **(config.properties or {})}
    conn = AmqpConnection(
        stream,
        attrs.evolve(config, properties=properties),
        initiator=initiator,
        peer=peer,
        on_attach=on_attach,
        max_outgoing_bytes=max_outgoing_bytes,
    )
    conn.log.info("connection.start", initiator=initiator)
    with body_errors_unwrapped() as body:
        try:
            async with trio.open_nursery() as nursery:
                conn.start(nursery)
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
            conn.finish(conn.error)
            await trio.aclose_forcefully(stream)


class EngineLimits(TypedDict, total=False):
    """The engine's bounds (``ConnectionConfig`` fields, defaults there): what
    :meth:`pairlink._config.limits.Limits.engine_options` gives, for ``listen`` and ``connect``."""

    max_message_size: int
    max_incomplete_bytes: int
    max_unsettled: int
    max_session_unsettled: int
    max_decoded_elements: int
    handle_max: int
    max_links: int


class EngineOptions(EngineLimits, total=False):
    """The ``ConnectionConfig`` fields that ``listen`` (its ``**config``) and the client's
    ``connect`` hand to the engine as given; the container id, idle timeout and SASL are
    keywords of each, with defaults of its own."""

    max_frame_size: int
    channel_max: int
    desired_capabilities: Sequence[str]
    properties: Fields | None
    session_window: int
    min_peer_idle_timeout: float


class ClientConfig(EngineOptions, total=False):
    """:func:`client_config`'s keywords, which :func:`connect` takes as its ``**config``."""

    container_id: str | None
    idle_timeout: float | None
    sasl: bool | str


def client_config(
    url: AmqpUrl,
    *,
    container_id: str | None = None,
    idle_timeout: float | None = 60.0,
    sasl: bool | str = True,
    **extra: Unpack[EngineOptions],
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
    connector: Connector | None = None,
    **config: Unpack[ClientConfig],
) -> AsyncIterator[AmqpConnection]:
    """Connect to ``amqp[s]://[user:password@]host[:port]``; SASL PLAIN when the URL has a
    user, ANONYMOUS otherwise. The open is pipelined: use ``wait_opened()`` to wait for it.
    ``connector``: the stream to use instead of TCP to the URL's host and port (TLS, SASL and
    the rest as for TCP). ``config``: ``ConnectionConfig`` fields (``idle_timeout``, the
    engine's limits...)."""
    parsed = AmqpUrl.parse(url)
    peer = f"{parsed.host}:{parsed.port}"
    opener = connector or functools.partial(trio.open_tcp_stream, parsed.host, parsed.port)
    with trio.fail_after(connect_timeout):
        stream: trio.abc.Stream = await opener()
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
