"""A gateway's connections to one next hop: a main one, and each caller's own.

The main connection is kept up by a background task: opened when the gateway starts, reopened
with capped, jittered backoff whenever it is lost, so a restarted next hop is found again
without waiting for traffic. While it is down, new pairs fail at once (``UpstreamUnavailable``)
rather than wait: the requester learns in one round trip that the route is broken, and may
retry. For a route of several replicas, the gateway asks each one's ``$health`` on it
(:mod:`pairlink._gateway.watch`): the :attr:`Upstream.state` they are chosen by
(:mod:`pairlink._gateway.replicas`). A next hop without others is ready while connected.

Pairs do not go on the main connection: each inbound connection (a *caller*) has a
:class:`Lane` of its own connections to the next hop, opened with its first pair there and
closed when it leaves. The next hop shares its mailbox, its running slots and its credit
leases per connection (each connection a caller in turn, a reserve for callers that hold
nothing); on one shared connection every caller of the gateway was one caller there, and one
client's hundreds of pairs held the credit another client's call waited for. On lanes, the
next hop keeps the gateway's callers apart as it keeps its own.

Each pair takes two link handles on a session, and a session has at most handle-max + 1 of them
(ours and the next hop's, the smaller): :meth:`Lane.place` puts each new pair on a session
with room, begins another session when all are full, and opens another connection for the lane
when the channel-max of one allows no more sessions. So the number of pairs is bounded by the
gateway's ``max_pairs`` and its shares alone, never by what one session or connection can hold.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from contextlib import asynccontextmanager
from urllib.parse import quote

import trio

from pairlink._amqp.session import Session, SessionState
from pairlink._client.placement import CONNECTING, DRAINING, LOST, READY, ReplicaState, room
from pairlink._config.limits import Limits
from pairlink._gateway.config import Route
from pairlink._gateway.watch import watch_health
from pairlink._io import net
from pairlink._io.backoff import jittered_backoff
from pairlink._io.connection import AmqpConnection
from pairlink._rpc.linkpair import LINK_PAIR_V1_0, offers_pairing
from pairlink._telemetry.logs import get_logger
from pairlink.errors import ConnectionLostError, PairlinkError

log = get_logger("pairlink.gateway")

RETRY_DELAY = 0.1
MAX_RETRY_DELAY = 5.0
PAIR_HANDLES = 2
"""Link handles one pair takes on its session: the sending half and the receiving half."""
_LIVE_SESSION = (SessionState.BEGIN_SENT, SessionState.MAPPED)
_CONNECTION_FAILURES = (*net.CONNECT_FAILURES, PairlinkError, TimeoutError)


class UpstreamUnavailable(PairlinkError):
    """The next hop cannot be reached now (never connected, or lost and not back yet)."""


class Upstream:
    """The connections to ``url`` (one of ``route.upstream``) with ``route``'s credentials
    (routes that share both share them): the main one, and a :class:`Lane` per caller with
    pairs there."""

    def __init__(
        self,
        url: str,
        route: Route,
        *,
        container_id: str,
        idle_timeout: float,
        connect_timeout: float,
        limits: Limits,
    ) -> None:
        parsed = net.AmqpUrl.parse(url)
        self.where = f"{parsed.host}:{parsed.port}"  # for logs only: never sent downstream
        credentials = ""
        if route.user is not None:
            credentials = f"{quote(route.user, safe='')}:{quote(route.password or '', safe='')}@"
        self._url = f"{parsed.scheme}://{credentials}{parsed.host}:{parsed.port}"
        self._ssl_context = ssl.create_default_context(cafile=route.ca) if parsed.tls else None
        self._container_id = container_id
        self._idle_timeout = idle_timeout
        self._connect_timeout = connect_timeout
        self._limits = limits  # the next hop is a peer too: held to the same bounds
        self.current: AmqpConnection | None = None
        self.lanes: dict[Hashable, Lane] = {}  # by caller
        self.sessions: dict[AmqpConnection, list[Session]] = {}  # every connection's sessions
        self.tried = trio.Event()  # the first attempt is over, whatever its result
        self.state: ReplicaState = CONNECTING  # by its main connection and its $health
        self.watched = False  # a replica among others: its $health is asked
        self.on_state: list[Callable[[], None]] = []  # told of each state it reports
        self.grants_on_attach = False  # a pair here had credit with its attach answer
        self._failures = 0
        self._nursery: trio.Nursery | None = None
        self._log = log.bind(upstream=self.where)

    @property
    def up(self) -> bool:
        """The main connection is open: the next hop is reachable, new pairs are placed."""
        return self.current is not None and not self.current.closed.is_set()

    @property
    def ready(self) -> bool:
        """It takes new pairs: connected, and its ``$health`` says ``serving`` (or it has
        none)."""
        return self.state == READY

    def set_state(self, state: ReplicaState) -> None:
        if state != self.state:
            self._log.info("upstream.state", state=state, was=self.state)
            self.state = state
        if state != CONNECTING:
            self.tried.set()
        for tell in self.on_state:
            tell()

    def stopping(self) -> None:
        """It detached a pair because it stops: no new pairs, until it is back (its
        ``$health`` says so). Only where the health is watched: a gateway passes on the
        detach of a service behind it, and is not stopping for that."""
        if self.watched and self.state == READY:
            self.set_state(DRAINING)

    def rank(self) -> int:
        """What replicas are ranked by for a new pair (:func:`pairlink._client.placement.room`):
        whether one of its pairs has credit left (or it has none yet: a new pair may bring its
        first call, LP-10), then how many pairs it carries. Read per session, not per link:
        each new pair of a route asks it of every replica."""
        handles = 0
        credit = False
        for conn, sessions in self.sessions.items():
            if conn is self.current:  # the main connection: its $health pair only
                continue
            for session in sessions:
                handles += len(session.links)
                credit = credit or any(
                    link.is_sender and link.usable_credit > 0 for link in session.links.values()
                )
        return room(1 if credit or not handles else 0, handles // PAIR_HANDLES)

    async def connection(self) -> AmqpConnection:
        """The live main connection (else the route is broken: ``UpstreamUnavailable``);
        waits only for the very first attempt to finish."""
        await self.tried.wait()
        conn = self.current
        if conn is None or conn.closed.is_set():
            raise UpstreamUnavailable("the next hop is unreachable")
        return conn

    def lane(self, caller: Hashable) -> Lane:
        """Where ``caller``'s pairs go (a new lane for its first)."""
        lane = self.lanes.get(caller)
        if lane is None:
            lane = self.lanes[caller] = Lane(self, caller)
        return lane

    def leave(self, caller: Hashable) -> None:
        """``caller`` is gone: its lane's connections close (their pairs were its own)."""
        lane = self.lanes.pop(caller, None)
        if lane is not None:
            lane.left.set()

    def room(self, conns: Sequence[AmqpConnection]) -> tuple[AmqpConnection, Session] | None:
        """A session of ``conns`` with room for a pair, beginning one on a connection that
        allows it."""
        for conn in conns:
            sessions = self.sessions.get(conn)
            if sessions is None or conn.closed.is_set():
                continue
            sessions[:] = [s for s in sessions if s.state in _LIVE_SESSION]
            for session in sessions:
                if _free_handles(session) >= PAIR_HANDLES:
                    return conn, session
            try:
                begun = conn.begin()
            except ConnectionLostError:  # closing as we look
                continue
            if begun is not None:
                sessions.append(begun)
                self._log.info("upstream.session", conn=conn.id, sessions=len(sessions))
                return conn, begun
        return None

    async def add_connection(self, lane: Lane) -> None:
        """One more connection for ``lane``, open when this returns."""
        assert self._nursery is not None
        try:
            conn: AmqpConnection = await self._nursery.start(self._hold_lane, lane)
        except _CONNECTION_FAILURES as exc:
            self._log.warning("upstream.lane_unreachable", error=str(exc))
            raise UpstreamUnavailable("the next hop is unreachable") from None
        self._log.info("upstream.lane_connected", conn=conn.id, lanes=len(self.lanes))

    async def _hold_lane(self, lane: Lane, *, task_status: trio.TaskStatus[AmqpConnection]) -> None:
        """A connection of ``lane``, until its caller leaves (then closed) or it is lost (not
        reopened: the caller's next pair that finds no room opens another)."""
        conn: AmqpConnection | None = None
        try:
            async with self._connected() as conn:
                lane.conns.append(conn)
                try:
                    task_status.started(conn)
                    await _either(conn.closed, lane.left)
                finally:
                    lane.conns.remove(conn)
        except _CONNECTION_FAILURES as exc:
            if conn is None:
                raise  # to add_connection, through nursery.start
            self._log.warning("upstream.lane_lost", conn=conn.id, error=str(exc))
        else:
            if not lane.left.is_set():
                error = str(conn.error or "closed")
                self._log.info("upstream.lane_lost", conn=conn.id, error=error)

    async def run(self) -> None:
        """Keep the main connection up until cancelled (the lanes' connections live in here
        too)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                try:
                    await self._hold()
                except _CONNECTION_FAILURES as exc:
                    self._failures += 1
                    delay = jittered_backoff(self._failures, RETRY_DELAY, MAX_RETRY_DELAY)
                    self._log.warning(
                        "upstream.unreachable",
                        attempt=self._failures,
                        retry_in=round(delay, 3),
                        error=str(exc),
                    )
                else:
                    self._failures = 1  # it was up: start again from a short delay
                    delay = jittered_backoff(self._failures, RETRY_DELAY, MAX_RETRY_DELAY)
                finally:
                    self.current = None
                    self.set_state(LOST)
                await trio.sleep(delay)

    async def _hold(self) -> None:
        async with self._connected() as conn:
            self.current = conn
            self._failures = 0
            self.set_state(CONNECTING)  # until its $health answers
            self._log.info("upstream.connected", conn=conn.id)
            async with trio.open_nursery() as nursery:
                if self.watched:
                    nursery.start_soon(watch_health, conn, lambda: self.state, self.set_state)
                else:
                    self.set_state(READY)
                await conn.closed.wait()
                nursery.cancel_scope.cancel()
            self._log.warning("upstream.lost", error=str(conn.error or "closed"))

    @asynccontextmanager
    async def _connected(self) -> AsyncIterator[AmqpConnection]:
        """A connection that is open and offers pairing, within the connect timeout."""
        with trio.move_on_after(self._connect_timeout) as scope:
            async with net.connect(
                self._url,
                ssl_context=self._ssl_context,
                connect_timeout=self._connect_timeout,
                container_id=self._container_id,
                idle_timeout=self._idle_timeout,
                desired_capabilities=[LINK_PAIR_V1_0],
                max_outgoing_bytes=self._limits.max_outgoing_bytes,
                **self._limits.engine_options(),
            ) as conn:
                first = conn.session  # begun now, in the same write as our open
                await conn.wait_opened()
                scope.deadline = math.inf
                if not offers_pairing(conn.remote_offered_capabilities):
                    # LP-2: we may not initiate pairs there; a configuration error to report
                    raise UpstreamUnavailable("the next hop does not offer LINK_PAIR_V1_0")
                self.sessions[conn] = [first]
                try:
                    yield conn
                finally:
                    del self.sessions[conn]
        if scope.cancelled_caught:
            raise TimeoutError(f"not connected within {self._connect_timeout} s")


class Lane:
    """The connections that carry one caller's pairs to the next hop: usually one, more only
    when the next hop's channel-max allows no more sessions on those open."""

    def __init__(self, upstream: Upstream, caller: Hashable) -> None:
        self.upstream = upstream
        self.caller = caller
        self.conns: list[AmqpConnection] = []
        self.left = trio.Event()  # the caller is gone: the connections close
        self.starved = False  # its last pair had no credit once answered (see answered)
        self._adding = trio.Lock()  # one connection opens at a time

    @property
    def waits_for_credit(self) -> bool:
        """Whether a pair answered here without credit waits for it (``CREDIT_WAIT``): not
        once the next hop has shown that it grants with its attach answer (a pairlink service
        or gateway does: one answered without credit has none coming soon), nor after the
        caller's last pair got none in that time (its pairs wait for the others' credit)."""
        return not (self.upstream.grants_on_attach or self.starved)

    def answered(self, *, at_once: bool, credit: bool) -> None:
        """A pair of the caller was answered, with credit ``at_once`` or none yet, and had
        ``credit`` when its wait was over."""
        if at_once:
            self.upstream.grants_on_attach = True
        self.starved = not credit

    async def place(self) -> tuple[AmqpConnection, Session]:
        """Where the caller's next pair goes: a session with two handles free. Returns with
        no checkpoint after the choice, so the caller attaches before anyone else looks."""
        upstream = self.upstream
        while True:
            await upstream.connection()  # the main connection is up, or the route is broken
            if self.left.is_set():
                raise UpstreamUnavailable("the caller has left")
            spot = upstream.room(self.conns)
            if spot is not None:
                return spot
            async with self._adding:  # every session is full, and no more can begin
                if upstream.room(self.conns) is None:
                    await upstream.add_connection(self)


async def _either(first: trio.Event, second: trio.Event) -> None:
    """Wait until ``first`` or ``second`` is set."""
    async with trio.open_nursery() as nursery:

        async def wait(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait, first)
        nursery.start_soon(wait, second)


def _free_handles(session: Session) -> int:
    """Handles still free on ``session``: its links count against the smaller handle-max of
    the two ends (the next hop's is known once its begin has come)."""
    return min(session.handle_max, session.remote_handle_max) + 1 - len(session.links)
