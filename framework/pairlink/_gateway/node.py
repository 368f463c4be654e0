"""The gateway: a listener for peers of one organisation, routes to the next hop (LP-11).

Each attach a peer sends is judged here: a paired attach for a configured public address, by
a user the route allows, starts a :class:`PairRelay`; a paired attach with an anonymous
terminus is the routing node (LP-9, :class:`RoutingRelay`). Everything else is refused with
the frames the pairing rules name: unknown address, null terminus + ``amqp:not-found``; a user
the route does not allow, ``amqp:unauthorized-access``; a link that is not paired,
``amqp:not-implemented`` (only a pair keeps ``reply-to: $me`` meaningful across hops without
rewriting the bare message, so the gateway carries nothing else); a new pair past the
configured ``max_pairs``, ``amqp:resource-limit-exceeded`` (the pairs carried go on).
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

from pairlink._amqp.errors import (
    INVALID_FIELD,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    RESOURCE_LIMIT_EXCEEDED,
    UNAUTHORIZED_ACCESS,
)
from pairlink._amqp.link import Link
from pairlink._amqp.messaging import Error
from pairlink._client.health import HEALTH
from pairlink._config.toml_config import server_tls_context
from pairlink._gateway.config import GatewayConfig, Route
from pairlink._gateway.health import HealthPair
from pairlink._gateway.metrics import GatewayMetrics
from pairlink._gateway.pairs import PairBudget, PairLease, PairRelay, Relay, RelayContext
from pairlink._gateway.replicas import RouteReplicas
from pairlink._gateway.routing import RoutingRelay
from pairlink._gateway.upstream import Upstream
from pairlink._io.connection import AmqpConnection
from pairlink._io.listener import Listener, listen
from pairlink._rpc.caller import Identity, InvalidClaim, judge_caller
from pairlink._rpc.linkpair import LINK_PAIR_V1_0, PairHalf, judge_attach
from pairlink._rpc.wire import CALL_ENVELOPE
from pairlink._telemetry.logs import get_logger

log = get_logger("pairlink.gateway")


class Downstream:
    """One inbound connection (the listener's handler of it): judges each link its peer
    opens, and keeps the pairs it relays, by link name."""

    def __init__(self, conn: AmqpConnection, context: RelayContext) -> None:
        self.conn = conn
        self.context = context
        self.user = conn.sasl_identity
        self.relays: dict[str, Relay] = {}
        self.log = conn.log.bind(user=self.user)

    def forget(self, relay: Relay) -> None:
        if self.relays.get(relay.name) is relay:
            del self.relays[relay.name]
            relay.release()

    def on_closed(self) -> None:
        """The connection is over: its pairs no longer count (their upstream ends are
        detached by their own link events)."""
        for relay in self.relays.values():
            relay.release()
        self.relays.clear()
        for replicas in set(self.context.upstreams.values()):
            replicas.leave(self.conn)  # its lanes close: they carried its pairs alone

    def may_use(self, route: Route) -> bool:
        return route.allow is None or (self.user is not None and self.user in route.allow)

    # -- attaches --------------------------------------------------------------------------

    def on_attach(self, link: Link) -> None:
        remote = link.remote_attach
        assert remote is not None
        half = PairHalf.of(remote)
        relay = self.relays.get(link.name)
        if relay is not None:
            if link.role in relay.halves:
                self._refuse(link, half, NOT_ALLOWED, "this pair has that half already")
            else:
                relay.add_half(link)
            return
        if not half.paired:
            why = "this gateway relays paired links only (LINK_PAIR_V1_0)"
            self._refuse(link, half, NOT_IMPLEMENTED, why)
            return
        context = self.context
        address = half.target if link.is_receiver else half.source
        if address is None:  # the routing node (LP-9): for users some route allows
            if not any(self.may_use(route) for route in context.routes.values()):
                why = f"{self.user or 'an anonymous peer'} may use no route of this gateway"
                self._refuse(link, half, UNAUTHORIZED_ACCESS, why)
                return
            caller = self._caller(link, half)
            lease = None if caller is None else self._lease(link, half)
            if caller is not None and lease is not None:
                relay = RoutingRelay(self, context, link.name, link, lease, caller)
                self.relays[link.name] = relay
            return
        if address == HEALTH:  # answered here, whatever the routes (a route may not be $health)
            self.relays[link.name] = HealthPair(self, context, link.name, link)
            return
        route = context.routes.get(address)
        refusal = judge_attach(
            half, known=route is not None, pairs=True, opposite=None, address=address
        )
        if refusal is not None:
            self._refuse(link, half, refusal.condition, refusal.description)
            return
        assert route is not None
        if not self.may_use(route):
            why = f"{self.user or 'an anonymous peer'} may not use {route.public!r}"
            self._refuse(link, half, UNAUTHORIZED_ACCESS, why)
            return
        caller = self._caller(link, half)
        lease = None if caller is None else self._lease(link, half)
        if caller is None or lease is None:
            return
        pair = PairRelay(self, route, link.name, link, lease, caller)
        self.relays[link.name] = pair
        release = self.conn.hold_input()
        context.start_soon(
            pair.open, context.upstreams[route.public], context.attach_timeout, release
        )

    def _caller(self, link: Link, half: PairHalf) -> Identity | None:
        """Whom a new pair carries for, to vouch for upstream: the peer's user, or the caller
        it vouches for if the gateway trusts it to (``vouching_users``); a claim of anyone
        else is dropped here. None, with the link refused: a malformed trusted claim."""
        remote = link.remote_attach
        assert remote is not None
        try:
            caller, ignored = judge_caller(
                self.user, remote.properties, self.context.vouching_users
            )
        except InvalidClaim as exc:
            self._refuse(link, half, INVALID_FIELD, str(exc))
            return None
        if ignored:
            self.log.debug("caller.claim_ignored", name=link.name)
        return caller

    def _lease(self, link: Link, half: PairHalf) -> PairLease | None:
        """A place for a new pair, or None with the link refused: ``max_pairs`` are carried,
        or this user's or this connection's share of them."""
        lease = self.context.pairs.take(self.user, self)
        if isinstance(lease, str):
            self._refuse(link, half, RESOURCE_LIMIT_EXCEEDED, f"{lease}; try later")
            return None
        return lease

    def _refuse(self, link: Link, half: PairHalf, condition: str, why: str) -> None:
        self.log.info(
            "link.refused",
            name=link.name,
            source=half.source,
            target=half.target,
            paired=half.paired,
            condition=condition,
        )
        self.conn.refuse(link, Error(condition, why))


class Gateway:
    """A running gateway (see ``open_gateway``)."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.container_id = config.container_id or f"pairlink-gateway-{uuid.uuid4()}"
        self.routes = {route.public: route for route in config.routes}
        self.pairs = PairBudget(
            config.max_pairs,
            config.pairs_per_user(),
            config.pairs_per_connection(),
            config.max_pairs_by_user,
        )
        self.listener: Listener[Downstream] | None = None
        shared: dict[tuple[str, str | None, str | None, str | None], Upstream] = {}
        self.upstreams: dict[str, RouteReplicas] = {}  # by public address
        for route in config.routes:
            replicas = []
            for url in route.upstream:
                key = (url, route.user, route.password, route.ca)
                if key not in shared:
                    shared[key] = Upstream(
                        url,
                        route,
                        container_id=self.container_id,
                        idle_timeout=config.idle_timeout,
                        connect_timeout=config.attach_timeout,
                        limits=config.limits,
                    )
                replicas.append(shared[key])
                shared[key].watched |= len(route.upstream) > 1
            self.upstreams[route.public] = RouteReplicas(replicas)
        self._next_hops = list(shared.values())
        self.context = RelayContext(
            routes=self.routes,
            upstreams=self.upstreams,
            pairs=self.pairs,
            attach_timeout=config.attach_timeout,
            start_soon=self.start_soon,
            vouching_users=config.vouching_users,
        )
        self._nursery: trio.Nursery | None = None
        self.log = log.bind(container=self.container_id)
        self.metrics: GatewayMetrics | None = None
        """Its Prometheus registry, with ``metrics_listen`` only."""
        if config.metrics_listen is not None:
            self.metrics = GatewayMetrics(
                config.metrics_listen,
                connections=self._open_connections,
                pairs=self.pairs,
                upstreams=self.upstreams,
            )
        self.metrics_url: str | None = None
        """Where to scrape the metrics (``http://host:port/metrics``), once listening."""

    @property
    def url(self) -> str:
        assert self.listener is not None, "the gateway is not listening yet"
        return self.listener.url

    @property
    def port(self) -> int:
        assert self.listener is not None, "the gateway is not listening yet"
        return self.listener.port

    async def run(
        self, *, task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect upstream, listen, relay; until cancelled."""
        config = self.config
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for upstream in self._next_hops:
                nursery.start_soon(upstream.run)
            async with listen(
                config.listen,
                accept=self._accept,
                users=config.users,
                certificate_users=config.certificate_users,
                ssl_context=self._server_tls(),
                container_id=self.container_id,
                idle_timeout=config.idle_timeout,
                # the envelope too: the services behind it read the bodies it relays, and
                # offer pairing, so in practice are pairlink containers (README, "Message
                # bodies"); to call a service of another stack here, a caller sets `encoding=`
                offered_capabilities=[LINK_PAIR_V1_0, CALL_ENVELOPE],
                **config.limits.listen_options(),
            ) as listener:
                self.listener = listener
                if self.metrics is not None:
                    from pairlink._telemetry.metrics_http import serve_metrics  # h11: an extra

                    metrics = self.metrics
                    self.metrics_url = await nursery.start(
                        serve_metrics, metrics.listen, metrics.registry
                    )
                self.log.info("gateway.listening", url=listener.url, routes=list(self.routes))
                task_status.started(self)
                await trio.sleep_forever()

    def _open_connections(self) -> int:
        return 0 if self.listener is None else len(self.listener.handlers)

    def _accept(self, conn: AmqpConnection) -> Downstream:
        return Downstream(conn, self.context)

    def _server_tls(self) -> ssl.SSLContext | None:
        config = self.config
        if config.tls_cert is None:
            return None
        assert config.tls_key is not None  # the config requires both
        return server_tls_context(config.tls_cert, config.tls_key, config.tls_client_ca)

    def start_soon(self, task: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run a relay's set-up task for as long as the gateway runs."""
        assert self._nursery is not None
        self._nursery.start_soon(self._guarded, task, *args)

    async def _guarded(self, task: Callable[..., Awaitable[object]], *args: object) -> None:
        """A bug in one relay's set-up fails that relay (it answers its peer itself), never
        the gateway: the traceback is logged and every other pair goes on."""
        try:
            await task(*args)
        except Exception as exc:
            self.log.error("relay.internal_error", task=repr(task), exc_info=exc)


@asynccontextmanager
async def open_gateway(config: GatewayConfig) -> AsyncIterator[Gateway]:
    """Run a gateway for the block; leaving it closes every inbound and upstream connection."""
    async with trio.open_nursery() as nursery:
        gateway: Gateway = await nursery.start(Gateway(config).run)
        try:
            yield gateway
        finally:
            nursery.cancel_scope.cancel()


async def run_gateway(
    config: GatewayConfig, *, task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run a gateway until cancelled (``task_status.started`` gets it once it listens)."""
    await Gateway(config).run(task_status=task_status)
