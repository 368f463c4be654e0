"""A client's replicas: one connection per endpoint, kept open, watched, and balanced.

A client given several URLs, or a host name that resolves to several addresses (a Kubernetes
headless service), holds one connection per replica, each in a task of its own
(:meth:`Replicas.keep`): it connects, reconnects with jittered backoff when the connection is
lost (``reconnect``), and asks the replica's ``$health`` every :data:`HEALTH_INTERVAL` while
connected. Names are resolved again every ``resolve_interval`` seconds: a new address is a new
replica, a vanished one is retired once its calls are answered.

Each call goes to the ``READY`` replica whose pair for its address has the most free credit
(:mod:`pairlink._client.placement`). A call the replica did not run goes to another replica:
one that waited in the line of a replica that was lost meanwhile (:class:`NotSent`), one the
replica had no room for (LP-10), one answered 503 "shutting down" (the replica began to drain
before we knew), one still unanswered when a stopping server detached its links (it answers
every call it holds first). A call whose request did reach a lost replica fails as
on one connection, with ``ConnectionLostError``: only its caller knows whether repeating it
is safe.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import attrs
import trio

from pairlink._amqp.errors import DETACH_FORCED
from pairlink._client.pairs import CallConnection, CallPair, NotSent
from pairlink._client.placement import CONNECTING, DRAINING, LOST, READY, ReplicaState, Rotation
from pairlink._client.reply import Reply
from pairlink._client.status import CHECK, HEALTH
from pairlink._client.status import DRAINING as HEALTH_DRAINING
from pairlink._io import net
from pairlink._io.backoff import jittered_backoff
from pairlink._io.net import AmqpUrl, Connector
from pairlink._rpc import wire
from pairlink._telemetry.logs import get_logger
from pairlink.errors import (
    AuthenticationError,
    ConnectionLostError,
    LinkDetachedError,
    PairlinkError,
    RemoteError,
)

log = get_logger("pairlink.client")

T = TypeVar("T")

RESOLVE_INTERVAL = 30.0
"""Seconds between two resolutions of a replica host name: the records of a Kubernetes
headless service live 30 s (its DNS TTL), so a pod that comes or goes is seen within a minute,
without a lookup per call."""
HEALTH_INTERVAL = 1.0
"""Seconds between two ``$health`` checks of each replica: one that begins to drain gets no new
calls a second later at most (most are kept away sooner: the drain takes its credit back at
once), and a small call a second per replica is nothing beside a call load."""
HEALTH_TIMEOUT = 5.0
"""Seconds a health check may take: a ready replica that does not answer within it (stopped,
or its loop blocked) is ``lost`` to new calls until it answers again, long before the
connection's idle timeout (60 s) would find it; its calls in flight wait for that, or for
their deadlines."""
RETIRE_POLL = 0.1
"""Seconds between two looks at a retired replica's calls: its connection closes once none is
in flight."""


@attrs.frozen
class Replica:
    """One replica as the client sees it (``Client.replicas``), for tests and metrics."""

    url: str
    """The URL that named it."""
    address: str | None
    """The address it connects to, when the URL's host name stands for several replicas
    (None: the URL's own host)."""
    state: ReplicaState
    """``connecting``, ``ready`` (takes calls), ``draining`` or ``lost`` (no new calls)."""
    free_credit: int
    """Calls it may take now, summed over its pairs (below zero: calls wait in their line)."""
    in_flight: int
    """Its calls not answered yet: sent, or waiting in line for its credit."""


class Holder(Protocol):
    """What the replicas need of their client (the :class:`pairlink.Client`)."""

    reconnect: bool
    retry_delay: float
    max_retry_delay: float
    settled: bool
    clock: trio.abc.Clock

    async def _connection(self, url: str, connector: Connector | None) -> CallConnection: ...

    def _new_pair(self, conn: CallConnection, address: str) -> CallPair: ...

    async def _pair_on(self, conn: CallConnection, address: str) -> CallPair: ...

    async def _pair_by(self, address: str, label: str, deadline_at: float) -> CallPair: ...


def in_flight(pairs: Sequence[CallPair]) -> int:
    """Calls sent on ``pairs`` and not answered (a request with a correlation-id of its own
    waits under both its ids)."""
    return sum(len(set(pair.calls.values())) for pair in pairs)


class Endpoint:
    """One replica held by the client: its URL, the address it connects to, its connection
    and its state."""

    def __init__(self, url: str, address: str | None) -> None:
        self.url = url
        self.address = address
        self.connector: Connector | None = None
        if address is not None:
            port = AmqpUrl.parse(url).port
            self.connector = functools.partial(trio.open_tcp_stream, address, port)
        self.state: ReplicaState = CONNECTING
        self.conn: CallConnection | None = None
        self.failures = 0
        self.error: BaseException | None = None  # the last failure to connect
        self.retired = False  # its address is no longer among the name's
        shown = net.redacted(url)
        self.log = log.bind(replica=shown if address is None else f"{shown} ({address})")

    def pairs(self) -> list[CallPair]:
        return _pairs(self.conn)

    def record(self) -> Replica:
        return describe(self.url, self.address, self.state, self.conn)


def _pairs(conn: CallConnection | None) -> list[CallPair]:
    return [] if conn is None or not conn.alive else list(conn.pairs.values())


def describe(
    url: str, address: str | None, state: ReplicaState, conn: CallConnection | None
) -> Replica:
    """The record of a replica whose current connection is ``conn``."""
    pairs = _pairs(conn)
    credit = sum(pair.free_credit() for pair in pairs if pair.ready.is_set())
    return Replica(url, address, state, credit, in_flight(pairs))


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def resolve(url: str) -> list[str] | None:
    """The addresses of ``url``'s host, one per replica: the IPv4 ones if any, else the IPv6
    ones (a dual-stack name lists each replica under both), in the resolver's order; None for
    an address literal, which is one replica as it stands."""
    parsed = AmqpUrl.parse(url)
    if _literal(parsed.host):
        return None
    infos = await trio.socket.getaddrinfo(parsed.host, parsed.port, type=trio.socket.SOCK_STREAM)
    by_family: dict[int, list[str]] = {}
    for family, _type, _proto, _name, sockaddr in infos:
        by_family.setdefault(int(family), []).append(str(sockaddr[0]))
    chosen = by_family.get(trio.socket.AF_INET) or by_family.get(trio.socket.AF_INET6) or []
    return list(dict.fromkeys(chosen))


async def replicas_of(
    url: str | Sequence[str], connector: net.Connector | None
) -> dict[str, list[str] | None]:
    """One URL whose host name resolves to several addresses: those addresses (they are
    replicas); else nothing to go by (one URL is connected to as it stands)."""
    if not isinstance(url, str) or connector is not None:
        return {}
    addresses = await resolve(url)
    return {url: addresses} if addresses is not None and len(addresses) > 1 else {}


async def reply_address(pair: CallPair) -> None:
    """A classic pair of one of several replicas learns its reply address here; should it
    fail, the pair keeps the error for its calls."""
    with contextlib.suppress(PairlinkError):
        await pair.wait_dynamic_address()


def _shutting_down(outcome: RemoteError | Reply) -> bool:
    """Whether a replica answered that it stops and did not run the call (503, "shutting
    down"): another replica may take it."""
    if isinstance(outcome, Reply):
        app = outcome.application_properties
        return outcome.status == wire.UNAVAILABLE and app.get(wire.STATUS_DESCRIPTION) == (
            wire.SHUTTING_DOWN
        )
    return outcome.status == wire.UNAVAILABLE and outcome.message == wire.SHUTTING_DOWN


def _stopped(error: LinkDetachedError) -> bool:
    """Whether a pair was detached by a stopping server after it answered every call it held:
    the calls still waiting were not run, and another replica may take them."""
    return error.condition == DETACH_FORCED and error.description == wire.SERVER_SHUTTING_DOWN


class Replicas:
    """The replicas of one client: their tasks, their states, and where each call goes."""

    def __init__(
        self,
        holder: Holder,
        nursery: trio.Nursery,
        urls: Sequence[str],
        *,
        resolve_interval: float,
        close_grace: float,
        resolved: dict[str, list[str] | None] | None = None,
    ) -> None:
        self.holder = holder
        self.urls = list(urls)
        self.resolve_interval = resolve_interval
        self.close_grace = close_grace
        self.endpoints: list[Endpoint] = []
        self.ready: list[Endpoint] = []  # the READY ones: what a call chooses among
        self.closed = False
        self._nursery = nursery
        self._resolved = dict(resolved or {})
        self._rotation = Rotation()
        self._changed = trio.Event()

    # -- states ----------------------------------------------------------------------------

    def _set_state(self, endpoint: Endpoint, state: ReplicaState) -> None:
        if endpoint.state == state:
            return
        endpoint.log.info("replica.state", state=state, was=endpoint.state)
        endpoint.state = state
        self._update()

    def _update(self) -> None:
        """After any change: the ready list again, and wake whoever waits for a change."""
        self.ready = [e for e in self.endpoints if e.state == READY and not e.retired]
        self._changed.set()
        self._changed = trio.Event()

    def records(self) -> list[Replica]:
        return [endpoint.record() for endpoint in self.endpoints]

    # -- start and stop --------------------------------------------------------------------

    async def start(self) -> None:
        """Resolve the names, start a task per replica, and return once each has been tried
        (connected and its health answered, or failed), so that the first calls spread over
        all; raise the first failure if none is ready."""
        for url in self.urls:
            addresses = self._resolved[url] if url in self._resolved else await resolve(url)
            if addresses is None:
                self._add(Endpoint(url, None))
                continue
            if not addresses:
                raise OSError(f"{net.redacted(url)}: the host name resolves to no address")
            for address in addresses:
                self._add(Endpoint(url, address))
        if any(not _literal(AmqpUrl.parse(url).host) for url in self.urls):
            self._nursery.start_soon(self._resolve_again)
        while any(e.state == CONNECTING for e in self.endpoints):
            await self._changed.wait()
        if not self.ready:
            failed = [e.error for e in self.endpoints if e.error is not None]
            raise failed[0] if failed else ConnectionLostError("no replica is serving")

    def _add(self, endpoint: Endpoint) -> None:
        self.endpoints.append(endpoint)
        self._nursery.start_soon(self.keep, endpoint)
        self._update()

    async def aclose(self, grace: float) -> None:
        """Close every connection politely, at once; calls in flight fail."""
        self.closed = True
        async with trio.open_nursery() as nursery:
            for endpoint in self.endpoints:
                conn = endpoint.conn
                if conn is not None and conn.alive:
                    nursery.start_soon(functools.partial(conn.amqp.close, grace=grace))

    # -- one replica -----------------------------------------------------------------------

    async def keep(self, endpoint: Endpoint) -> None:
        """Connect to ``endpoint``, watch it while connected, and connect again with backoff
        once lost (``reconnect``), until the client closes or the replica is retired."""
        holder = self.holder
        while not (self.closed or endpoint.retired):
            try:
                conn = await holder._connection(endpoint.url, endpoint.connector)
            except (*net.CONNECT_FAILURES, TimeoutError, AuthenticationError) as exc:
                endpoint.failures += 1
                endpoint.error = exc
                delay = jittered_backoff(
                    endpoint.failures, holder.retry_delay, holder.max_retry_delay
                )
                endpoint.log.warning(
                    "replica.connect_failed",
                    attempt=endpoint.failures,
                    retry_in=round(delay, 3),
                    error=repr(exc),
                )
                self._set_state(endpoint, LOST)
                if not holder.reconnect:
                    return
                await trio.sleep(delay)
                continue
            endpoint.failures = 0
            endpoint.conn = conn
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_health, endpoint, conn)
                await conn.amqp.closed.wait()
                nursery.cancel_scope.cancel()
            self._set_state(endpoint, LOST)
            if not holder.reconnect:
                return
            await trio.sleep(jittered_backoff(1, holder.retry_delay, holder.max_retry_delay))
        if endpoint.retired:
            self.endpoints.remove(endpoint)
            self._update()

    async def _watch_health(self, endpoint: Endpoint, conn: CallConnection) -> None:
        """Ask the replica's ``$health`` now and every :data:`HEALTH_INTERVAL`: ``draining``
        takes it out of the calls' choice, ``serving`` puts it (back) in. A peer with no
        health service (not a pairlink server or gateway) is ready as long as it is
        connected."""
        holder = self.holder
        while True:
            now = holder.clock.current_time()
            try:
                pair = await holder._pair_on(conn, HEALTH)
                answer = await pair.call(
                    CHECK, ("",), {}, now + HEALTH_TIMEOUT, None, holder.settled, None, now
                )
            except ConnectionLostError:
                return  # keep() sees it
            except TimeoutError:
                endpoint.log.warning("replica.health_timeout", timeout=HEALTH_TIMEOUT)
                if endpoint.state == CONNECTING:  # just connected: silent health is no verdict
                    self._set_state(endpoint, READY)
                else:  # it was answering: no new calls until it answers again
                    self._set_state(endpoint, LOST)
            except PairlinkError as exc:  # refused, 404: nothing to watch there
                endpoint.log.debug("replica.no_health", error=str(exc))
                self._set_state(endpoint, READY)
                return
            else:
                status = answer.get("status") if isinstance(answer, dict) else None
                self._set_state(endpoint, DRAINING if status == HEALTH_DRAINING else READY)
            await trio.sleep(HEALTH_INTERVAL)

    async def _retire(self, endpoint: Endpoint, grace: float) -> None:
        """A replica whose address is gone takes no new call; its connection closes once
        none of its calls is in flight (then ``keep`` ends)."""
        endpoint.retired = True
        endpoint.log.info("replica.retiring")
        self._update()
        while in_flight(endpoint.pairs()):  # noqa: ASYNC110 - replies end calls in the reader
            await trio.sleep(RETIRE_POLL)  # task: a rare retirement looks, no hook per reply
        conn = endpoint.conn
        if conn is not None and conn.alive:
            await conn.amqp.close(grace=grace)

    # -- resolution ------------------------------------------------------------------------

    async def _resolve_again(self) -> None:
        """Every ``resolve_interval``: a new address of a name is a new replica, one gone is
        retired; a failed lookup keeps the replicas as they are."""
        while True:
            await trio.sleep(self.resolve_interval)
            for url in self.urls:
                try:
                    addresses = await resolve(url)
                except OSError as exc:
                    log.warning("replica.resolve_failed", url=net.redacted(url), error=str(exc))
                    continue
                if not addresses:  # a literal, or an empty answer: nothing to go by
                    continue
                known: dict[str | None, Endpoint] = {
                    e.address: e for e in self.endpoints if e.url == url and not e.retired
                }
                for address in addresses:
                    if address not in known:
                        log.info("replica.added", url=net.redacted(url), address=address)
                        self._add(Endpoint(url, address))
                for gone, endpoint in known.items():
                    if gone not in addresses:
                        self._nursery.start_soon(self._retire, endpoint, self.close_grace)

    # -- calls -----------------------------------------------------------------------------

    def ready_pair(self, address: str) -> CallPair | None:
        """The pair a call to ``address`` goes on now: of the ready replicas', the one with
        the most free credit (a replica with none for ``address`` yet gets one, attached
        with the call on a peer that pairs); None if none is ready."""
        pairs = []
        for endpoint in self.ready:
            conn = endpoint.conn
            if conn is None or not conn.alive:
                continue
            pair = conn.pairs.get(address)
            if pair is None:
                pair = self.holder._new_pair(conn, address)
            if pair.ready.is_set() and pair.error is None:
                pairs.append(pair)
        return self._rotation.pick(pairs, CallPair.room)

    async def pair(self, address: str) -> CallPair:
        """A pair for ``address``, waiting for a replica to be ready (or for a classic pair's
        reply address) if need be."""
        while True:
            pair = self.ready_pair(address)
            if pair is not None:
                return pair
            live = [e.conn for e in self.ready if e.conn is not None and e.conn.alive]
            if live:  # classic pairs, waiting for their reply address
                return await self.holder._pair_on(live[0], address)
            self._check_reachable()
            await self._changed.wait()

    async def live(self) -> CallConnection:
        """A connection of a ready replica, waiting for one if need be."""
        while True:
            for endpoint in self.ready:
                if endpoint.conn is not None and endpoint.conn.alive:
                    return endpoint.conn
            self._check_reachable()
            await self._changed.wait()

    def _check_reachable(self) -> None:
        """Raise when no replica will be ready again: the client is closed, or every one
        is lost and ``reconnect`` is off."""
        if self.closed:
            raise ConnectionLostError("the client is closed")
        if not self.holder.reconnect and all(e.state == LOST for e in self.endpoints):
            errors = [e.conn.amqp.error for e in self.endpoints if e.conn is not None]
            raise next((e for e in errors if e is not None), None) or ConnectionLostError(
                "every replica's connection is closed"
            )

    async def exchange(
        self,
        address: str,
        label: str,
        deadline_at: float,
        exchange: Callable[[CallPair], Awaitable[T]],
    ) -> T:
        """``exchange`` on the pair the rule picks, and on another whenever the replica it
        went to did not take it (see the module's docstring), once per replica at most."""
        attempts = 0
        again = False
        while True:
            pair = self.ready_pair(address)
            if pair is None:
                pair = await self.holder._pair_by(address, label, deadline_at)
            if again and not pair.granted:
                pair.fresh = False  # credit first: the one it was sent to had no room
            try:
                outcome = await exchange(pair)
            except NotSent as exc:
                error: PairlinkError = exc.error
            except LinkDetachedError as exc:
                if _stopped(exc):
                    self._leave(pair)
                elif not pair.had_no_room(exc):
                    raise
                error = exc
            except RemoteError as exc:
                if not _shutting_down(exc):
                    raise
                self._leave(pair)
                error = exc
            else:
                last = attempts >= len(self.endpoints)
                if last or not (isinstance(outcome, Reply) and _shutting_down(outcome)):
                    return outcome  # (a request's status is its caller's to read)
                self._leave(pair)
                error = RemoteError(wire.UNAVAILABLE, wire.SHUTTING_DOWN)
            attempts += 1
            if attempts > len(self.endpoints):
                raise error
            pair.log.debug("call.placed_again", operation=label, error=str(error))
            again = True

    def _leave(self, pair: CallPair) -> None:
        """The replica of ``pair`` said it stops: no new calls until its health says
        otherwise."""
        for endpoint in self.endpoints:
            if endpoint.conn is pair.conn:
                self._set_state(endpoint, DRAINING)
