"""Serving: ``open_server`` and ``serve`` run services on a listener; ``remote`` lets a
handler call another service through the server's own client connection."""

from __future__ import annotations

import contextlib
import ssl
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Unpack

import attrs
import trio

from pairlink._amqp.errors import DETACH_FORCED
from pairlink._amqp.link import Link, LinkState
from pairlink._amqp.messaging import Error
from pairlink._client.client import Client
from pairlink._client.client import connect as connect_client
from pairlink._client.health import DRAINING, HEALTH
from pairlink._client.proxy import ServiceProxy
from pairlink._config.limits import DRAIN_TIMEOUT, MAX_LINKS_TOTAL, Limits, ListenLimits
from pairlink._io.connection import AmqpConnection
from pairlink._io.listener import Listener
from pairlink._io.listener import listen as listen_amqp
from pairlink._io.net import AmqpUrl, Connector, EngineOptions
from pairlink._io.taskgroups import lone_errors_unwrapped
from pairlink._rpc.batch import MAX_BATCH_ROWS
from pairlink._rpc.linkpair import LINK_PAIR_V1_0
from pairlink._rpc.wire import CALL_ENVELOPE, SERVER_SHUTTING_DOWN
from pairlink._server.actor import Actor
from pairlink._server.container import Container, Peer
from pairlink._server.context import Middleware, check_middleware
from pairlink._server.health import Health
from pairlink._server.metrics import ServerMetrics
from pairlink._server.service import Hosted, hosted, spec_of

DEFAULT_URL = "amqp://127.0.0.1:5672"

current_server: ContextVar[Server | None] = ContextVar("pairlink_server", default=None)
"""The server whose handler (or on_start/on_stop) is running: how ``remote()`` finds it."""


@attrs.frozen
class _Served:
    """One connection to a server (its listener's handler): the container judges the links
    its peer opens, against what it keeps of that peer (:class:`Peer`)."""

    peer: Peer
    container: Container

    def on_attach(self, link: Link) -> None:
        self.container.on_attach(self.peer, link)

    def on_closed(self) -> None:
        """Nothing to undo: the peer's links ended with the connection, each telling its
        actor, and the peer is dropped with this handler."""


class Server:
    """A running service container (see :func:`open_server`)."""

    def __init__(
        self,
        hosted: Sequence[Hosted],
        *,
        urls: Sequence[str | None],
        users: dict[str, str] | None,
        ssl_context: ssl.SSLContext | None,
        grace: float,
        container_id: str | None,
        call_url: str | None,
        listen_options: ListenOptions,
        metrics_listen: str | None = None,
        middleware: Sequence[Middleware] = (),
        drain_timeout: float = DRAIN_TIMEOUT,
        max_links_total: int = MAX_LINKS_TOTAL,
        max_batch_rows: int = MAX_BATCH_ROWS,
        vouching_users: Collection[str] = (),
    ) -> None:
        self.hosted = list(hosted)
        actors: dict[str, Actor] = {}
        for item in self.hosted:
            if item.address in actors:
                raise ValueError(f"two services at the address {item.address!r}")
            # not the health's middleware: probes pass
            actors[item.address] = Actor(item, middleware, drain_timeout, max_batch_rows)
        if HEALTH in actors:
            raise ValueError(f"{HEALTH!r} is the address of the server's own health service")
        self.health = Health({address: actor.mailbox for address, actor in actors.items()})
        health = Hosted(self.health, spec_of(self.health))
        self._health_actor = Actor(health, drain_timeout=drain_timeout)  # its own mailbox
        builtin = {HEALTH: self._health_actor}
        self.container = Container(
            actors | builtin,
            container_id or f"pairlink-{uuid.uuid4()}",
            max_links_total,
            vouching_users,
        )
        self.actors = actors  # the user's services (what a graceful stop drains)
        self.container_id = self.container.container_id
        self.grace = grace
        self.listener: Listener[_Served] | None = None
        """The first listener (``url``, ``port`` and ``remote()`` use it)."""
        self.listeners: list[Listener[_Served]] = []
        self.log = self.container.log
        self._urls = list(urls)
        self._users = users
        self._ssl_context = ssl_context
        self._call_url = call_url
        self._listen_options = listen_options
        self._stop = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._client: Client | None = None
        self._client_lock = trio.Lock()
        self._client_done = trio.Event()
        self.metrics: ServerMetrics | None = None
        """Its Prometheus registry and call observers, with ``metrics_listen`` only."""
        if metrics_listen is not None:
            self.metrics = ServerMetrics(metrics_listen, actors | builtin, self._open_connections)
        self.metrics_url: str | None = None
        """Where to scrape the metrics (``http://host:port/metrics``), once listening."""

    @property
    def url(self) -> str:
        """``amqp[s]://host:port`` as listened on (the real port when asked for port 0)."""
        assert self.listener is not None, "the server is not listening yet"
        return self.listener.url

    @property
    def port(self) -> int:
        assert self.listener is not None, "the server is not listening yet"
        return self.listener.port

    @property
    def urls(self) -> list[str]:
        """Every listener's ``amqp[s]://host:port``, in the order of ``listen``."""
        assert self.listener is not None, "the server is not listening yet"
        return [listener.url for listener in self.listeners]

    def stop(self) -> None:
        """Begin the graceful shutdown (``run`` returns once it is done)."""
        self._stop.set()

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the services, listen, and after ``stop()`` shut down gracefully.

        Shielded from cancellation once listening: a cancelled caller still gets the graceful
        shutdown, bounded by the grace period (and by whatever ``on_stop`` and blocking
        handlers take). Cancelled before that, the start is abandoned at once (``on_stop``
        still runs for the services whose ``on_start`` finished).
        """
        token = current_server.set(self)
        try:
            with trio.CancelScope() as scope:  # shielded by _listen
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    started: list[Actor] = []
                    try:
                        for actor in self.actors.values():
                            await self._hook(actor, "on_start")
                            started.append(actor)
                        started.append(self._health_actor)  # has no hooks
                        for actor in started:
                            await nursery.start(actor.run)
                        await self._listen(task_status, scope)
                    finally:
                        with trio.CancelScope(shield=True):
                            for actor in started:
                                actor.begin_stop()  # no-op after a drain; else ends the workers
                            for actor in reversed(started):
                                await self._hook(actor, "on_stop")
                            self._client_done.set()
        finally:
            current_server.reset(token)
        self.log.info("server.stopped")

    async def _listen(self, task_status: trio.TaskStatus[None], scope: trio.CancelScope) -> None:
        async with contextlib.AsyncExitStack() as stack:  # leaving it closes every connection
            for url in self._urls:
                secure = url is not None and AmqpUrl.parse(url).tls
                listener = await stack.enter_async_context(
                    listen_amqp(
                        url,
                        accept=self._accept,
                        users=self._users,
                        # only amqps:// ones: listen() would speak TLS on any URL given one
                        ssl_context=self._ssl_context if secure else None,
                        container_id=self.container_id,
                        # LP-1: we accept peer-initiated links; our clients may send the envelope
                        offered_capabilities=[LINK_PAIR_V1_0, CALL_ENVELOPE],
                        **self._listen_options,
                    )
                )
                self.listeners.append(listener)
                self.log.info("server.listening", url=listener.url, services=list(self.actors))
            self.listener = self.listeners[0]
            if self.metrics is not None:  # scraped until the connections close, drain included
                scrapes = await stack.enter_async_context(trio.open_nursery())
                stack.callback(scrapes.cancel_scope.cancel)  # (exits first: last in)
                from pairlink._telemetry.metrics_http import serve_metrics  # h11: an extra

                metrics = self.metrics
                self.metrics_url = await scrapes.start(
                    serve_metrics, metrics.listen, metrics.registry
                )
            # a cancel that came as we finished starting ends it here: once shielded, a
            # started() into a cancelled nursery.start would leave us waiting for a stop()
            await trio.lowlevel.checkpoint_if_cancelled()
            scope.shield = True  # serving: from now on, only stop() ends it, gracefully
            task_status.started()
            await self._stop.wait()
            self.log.info("server.stopping", grace=self.grace)
            self.health.status = DRAINING  # and it answers so until its links go, below
            await self._drain()
            # every call held is answered: the links go, saying why (a call still waiting
            # for credit fails with this condition and text, not a bare detach)
            why = Error(DETACH_FORCED, SERVER_SHUTTING_DOWN)
            for listener in self.listeners:
                for served in list(listener.handlers.values()):
                    for endpoint in served.peer.endpoints():
                        if endpoint.link.state is LinkState.ATTACHED:
                            served.peer.conn.detach(endpoint.link, error=why)

    async def _drain(self) -> None:
        """Stop credit, let the held calls finish (``grace`` seconds at most), then cancel
        what still runs; every call is answered (503 when cut short) before links go."""
        actors = list(self.actors.values())
        for actor in actors:
            actor.begin_stop()
        with trio.move_on_after(self.grace):
            for actor in actors:
                await actor.drained()
        for actor in actors:
            if actor.held:
                actor.log.warning("service.grace_expired", held=actor.held)
            actor.abort()
        for actor in actors:
            await actor.finished.wait()

    async def _hook(self, actor: Actor, name: str) -> None:
        """Run ``on_start`` (its failure stops the server) or ``on_stop`` (its failure is
        logged, and the other services still stop)."""
        hook = getattr(actor.instance, name, None)
        if hook is None:
            return
        try:
            await hook()
        except Exception as exc:
            if name == "on_start":
                raise
            actor.log.error(f"service.{name}_failed", error=repr(exc), exc_info=exc)
            return
        actor.log.info(f"service.{name}")

    def _open_connections(self) -> int:
        return sum(len(listener.handlers) for listener in self.listeners)

    def _accept(self, conn: AmqpConnection) -> _Served:
        return _Served(Peer(conn, self.container.links), self.container)

    # -- actor to actor --------------------------------------------------------------------

    async def remote(self, address: str) -> ServiceProxy:
        """A client proxy for ``address``, over the server's own client connection."""
        return await (await self._remote_client()).service(address)

    async def _remote_client(self) -> Client:
        async with self._client_lock:
            if self._client is None:
                assert self._nursery is not None
                self._client = await self._nursery.start(self._hold_client)
            return self._client

    async def _hold_client(self, *, task_status: trio.TaskStatus[Client]) -> None:
        url = self._call_url
        connector: Connector | None = None
        if url is None:
            if self.listener is None or self._stop.is_set():
                raise RuntimeError(
                    "remote() reaches this server's own services only while it serves "
                    "(not from on_start or on_stop): pass call_url to reach another one"
                )
            url = self.listener.url
            if not self.listener.port:  # a server without a socket: its services in memory
                connector = self.listener.open_stream
        async with connect_client(url, reconnect=True, connector=connector) as client:
            task_status.started(client)
            await self._client_done.wait()


class ListenOptions(ListenLimits, EngineOptions, total=False):
    """``open_server``'s keywords for :func:`pairlink._io.listener.listen`, its ``**options``:
    every keyword of ``listen`` but those the server sets (its URLs, users, TLS context,
    container id and offered capabilities)."""

    allow_anonymous: bool | None
    idle_timeout: float | None
    certificate_users: Collection[str] | None
    reuse_port: bool


class ServeOptions(ListenOptions, total=False):
    """``open_server``'s keywords but ``listen``, ``users`` and ``ssl_context``: what ``serve``
    and :func:`pairlink.testing.serve_in_memory` pass on."""

    grace: float
    container_id: str | None
    call_url: str | None
    limits: Limits | None
    metrics_listen: str | None
    middleware: Sequence[Middleware]
    vouching_users: Collection[str]


@asynccontextmanager
async def open_server(
    *services: object,
    listen: str | Sequence[str] | None = DEFAULT_URL,
    users: dict[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    grace: float = 10.0,
    container_id: str | None = None,
    call_url: str | None = None,
    limits: Limits | None = None,
    metrics_listen: str | None = None,
    middleware: Sequence[Middleware] = (),
    vouching_users: Collection[str] = (),
    **options: Unpack[ListenOptions],
) -> AsyncIterator[Server]:
    """Serve ``services`` (``@service`` classes, instances, or ``hosted(...)``) for the
    duration of the block; ``server.url`` says where (``listen`` may use port 0;
    ``listen=None`` opens no socket: clients connect over in-memory streams, as
    :mod:`pairlink.testing` does). ``listen`` may also be several URLs, ``amqp://`` and
    ``amqps://`` mixed: one listener each, serving the same services (``server.urls``;
    ``server.url`` is the first's).

    Leaving the block, even by cancellation, shuts down gracefully: credit stops, calls
    already held are finished and answered (for ``grace`` seconds at most; after that they
    are cancelled and answered 503), links are detached, connections closed, then each
    service's ``on_stop`` runs. Cancelled before the server listens, the start is given up at
    once (a pending ``on_start`` is cancelled). ``users`` turns on SASL PLAIN; ``ssl_context``
    serves the ``amqps://`` listeners (and, verifying client certificates, logs in the
    ``certificate_users`` option's names with SASL EXTERNAL); ``call_url`` is where
    :func:`remote` connects (default: this server); ``limits`` bounds what peers can make the
    server hold (:class:`pairlink.Limits`, every field documented with its default;
    each listener keeps its own ``max_connections``); ``options`` go to
    the listeners (``idle_timeout``, ``max_frame_size``...) and override ``limits``.
    ``metrics_listen`` (``HOST:PORT``, port 0 allowed) serves Prometheus metrics over HTTP
    there (``server.metrics_url``; needs ``prometheus_client``, the ``metrics`` extra).
    ``middleware``: async callables ``mw(call, proceed)`` around every call of every service
    (not the health checks), the first outermost, outside each service's own.
    ``vouching_users``: SASL users (gateways') trusted to vouch for the callers they carry
    (``pairlink:caller``): a call through them is its caller's (``current_call().user``, the
    dedup store's key), not theirs; anyone else's claim is ignored.
    """
    served = [s if isinstance(s, Hosted) else hosted(s) for s in services]
    bounds = limits or Limits()
    urls = [listen] if listen is None or isinstance(listen, str) else list(listen)
    if not urls:
        raise ValueError("listen: no URLs (None serves in memory only)")
    server = Server(
        served,
        urls=urls,
        users=users,
        ssl_context=ssl_context,
        grace=grace,
        container_id=container_id,
        call_url=call_url,
        listen_options={**bounds.listen_options(), **options},
        drain_timeout=bounds.drain_timeout,
        max_links_total=bounds.max_links_total,
        max_batch_rows=bounds.max_batch_rows,
        metrics_listen=metrics_listen,
        middleware=check_middleware("open_server", middleware),
        vouching_users=_names("vouching_users", vouching_users),
    )
    with lone_errors_unwrapped():
        async with trio.open_nursery() as nursery:
            try:
                # inside the try: however the start ends, a server that got going is stopped
                # (``run`` gives up a cancelled start itself, before it shields its shutdown)
                await nursery.start(server.run)
                yield server
            finally:
                server.stop()  # the server task is shielded: the nursery waits for its shutdown


def _names(option: str, names: Collection[str]) -> frozenset[str]:
    """``names`` as a set of user names; ``TypeError`` for a lone string, whose letters
    would each be a name."""
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise TypeError(f"{option}: expected a collection of user names (strings)")
    return frozenset(names)


async def serve(
    *services: object,
    listen: str | Sequence[str] | None = DEFAULT_URL,
    users: dict[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
    **options: Unpack[ServeOptions],
) -> None:
    """Serve until cancelled, then shut down gracefully (see :func:`open_server`, which takes
    the same arguments). ``await nursery.start(serve, ...)`` returns the running server."""
    async with open_server(
        *services, listen=listen, users=users, ssl_context=ssl_context, **options
    ) as server:
        task_status.started(server)
        await trio.sleep_forever()


async def remote(address: str) -> ServiceProxy:
    """A proxy for the service at ``address``, for a handler (or ``on_start``/``on_stop``)
    calling another service: ``calc = await remote("calc"); await calc.add(1, 2)``.

    Calls go over one client connection the server keeps (to itself unless ``call_url`` says
    otherwise) and inherit what is left of the calling request's deadline. Before the server
    listens and once it stops (``on_start``, ``on_stop``) only services elsewhere can be
    reached, through ``call_url``. A service that calls *itself* with ``max_concurrency=1``
    waits for its own free slot: a deadlock that only the deadline ends.
    """
    server = current_server.get(None)
    if server is None:
        raise RuntimeError("remote() works inside a served handler, on_start or on_stop")
    return await server.remote(address)
