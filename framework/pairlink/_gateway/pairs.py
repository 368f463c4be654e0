"""A paired link relayed across a gateway (LP-11): the requester's pair downstream, a pair of
the gateway's own upstream, and two hops between them.

The upstream pair gets a new link name and the gateway's own terminus addresses, and the
route's next-hop address as its node: nothing the requester called its ends, and nothing the
next hop calls its node, crosses the gateway. The downstream attach is answered only once the
upstream pair is attached and has its first credit (the downstream connection's input is held
meanwhile, so a pipelined first request still finds its credit, LP-10); an upstream refusal is
answered downstream with the same condition.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Protocol, TypeVar

import attrs
import trio

from pairlink._amqp.errors import DETACH_FORCED, INTERNAL_ERROR, PRECONDITION_FAILED
from pairlink._amqp.link import Delivery, Link
from pairlink._amqp.messaging import Error, Source, Target
from pairlink._amqp.performatives import RCV_FIRST, ROLE_RECEIVER, ROLE_SENDER, SND_MIXED
from pairlink._amqp.session import Session
from pairlink._gateway.config import Route
from pairlink._gateway.relay import Hop
from pairlink._gateway.replicas import RouteReplicas
from pairlink._gateway.upstream import Lane, UpstreamUnavailable
from pairlink._gateway.watch import stopped
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import LinkEnd, LinkOwner
from pairlink._rpc.caller import Identity
from pairlink._rpc.linkpair import PairHalf, judge_attach, paired_mismatch, paired_properties
from pairlink._telemetry.logs import get_logger

log = get_logger("pairlink.gateway")

CREDIT_WAIT = 1.0
"""How long an attached upstream pair may take to grant its first credit before the downstream
pair is answered anyway, for a next hop that sends its credit after its attach answer. Not
waited where it gains nothing (:attr:`pairlink._gateway.upstream.Lane.waits_for_credit`): the
peer's input is held meanwhile, and a caller opening pairs past what the next hop gives it had
each of them answered one ``CREDIT_WAIT`` per gateway after the other (2 s a pair through two),
its other traffic unread all along, until its own idle timeout closed it."""


K = TypeVar("K")


class PairBudget:
    """The pairs a gateway carries now, against its ``max_pairs``: each pair a peer attaches,
    and each next hop a routing node pairs with, holds a :class:`PairLease` while it lives.
    No user may hold more than its share of them (in ``by_user``, else ``per_user``), nor one
    connection more than ``per_connection``, so that one party never takes every place."""

    def __init__(
        self,
        limit: int,
        per_user: int,
        per_connection: int,
        by_user: Mapping[str, int] | None = None,
    ) -> None:
        self.limit = limit
        self.per_user = per_user
        self.per_connection = per_connection
        self.shares: Mapping[str, int] = by_user or {}
        self.used = 0
        self.by_user: dict[str | None, int] = {}
        self.by_connection: dict[object, int] = {}

    def take(self, user: str | None, connection: object) -> PairLease | str:
        """A place for one more pair of ``user`` on ``connection``; else why not."""
        if self.used >= self.limit:
            return f"this gateway carries its maximum of {self.limit} pairs"
        share = self.per_user if user is None else self.shares.get(user, self.per_user)
        if self.by_user.get(user, 0) >= share:
            return f"{user or 'anonymous peers'} may hold {share} pairs at most"
        if self.by_connection.get(connection, 0) >= self.per_connection:
            return f"one connection may hold {self.per_connection} pairs at most"
        self.used += 1
        self.by_user[user] = self.by_user.get(user, 0) + 1
        self.by_connection[connection] = self.by_connection.get(connection, 0) + 1
        return PairLease(self, user, connection)

    def give_back(self, user: str | None, connection: object) -> None:
        self.used -= 1
        _count_down(self.by_user, user)
        _count_down(self.by_connection, connection)


def _count_down(counts: dict[K, int], key: K) -> None:
    """One fewer for ``key``; a key counted down to nothing is forgotten."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


class PairLease:
    """One pair's place in a :class:`PairBudget`. ``release`` may be called by every way the
    pair can end (its links, its connection, its set-up failing): only the first counts."""

    __slots__ = ("_budget", "_connection", "_user")

    def __init__(self, budget: PairBudget, user: str | None, connection: object) -> None:
        self._budget: PairBudget | None = budget
        self._user = user
        self._connection = connection

    def release(self) -> None:
        if self._budget is not None:
            self._budget.give_back(self._user, self._connection)
            self._budget = None


class Relay(Protocol):
    """A pair the gateway carries for a downstream peer: a :class:`PairRelay`, or a routing
    node (LP-9). Known by its link name; its halves arrive one attach at a time."""

    name: str
    halves: dict[bool, PairHalf]

    def add_half(self, link: Link) -> None: ...
    def release(self) -> None: ...


class RelayOwner(Protocol):
    """What a relay needs of the downstream connection it carries a pair for (the gateway's
    handler of that connection)."""

    conn: AmqpConnection
    user: str | None  # its SASL user (None: none)

    def may_use(self, route: Route) -> bool:
        """The peer's user may reach ``route`` (its ``allow`` list)."""

    def forget(self, relay: Relay) -> None:
        """``relay`` is over: it no longer counts, and its link name is free again."""


@attrs.frozen
class RelayContext:
    """What the relays of one gateway share: its routes and the replicas of each (by public
    address), its pair budget, how long an upstream pair may take to attach,
    ``start_soon``, which runs a set-up task for as long as the gateway runs, and the users it
    trusts to vouch for their callers."""

    routes: Mapping[str, Route]
    upstreams: Mapping[str, RouteReplicas]
    pairs: PairBudget
    attach_timeout: float
    start_soon: Callable[..., None]
    vouching_users: frozenset[str] = frozenset()


def scrubbed(error: Error, route: Route) -> Error:
    """An upstream error fit to pass downstream: same condition, the next hop's address for
    this route replaced by the public one, no ``info`` (it may name anything internal)."""
    description = error.description
    if description and route.address != route.public:
        description = description.replace(route.address, route.public)
    return Error(condition=error.condition, description=description)


def upstream_ending(end: LinkEnd, route: Route) -> Error | None:
    """What to tell downstream when an upstream end is over: its detach's error (scrubbed),
    or ``detach-forced`` when it went with its connection."""
    if end.detached is None or end.conn.closed.is_set():
        return Error(DETACH_FORCED, f"the connection to the next hop for {route.public!r} is lost")
    error = end.ending_error()
    return None if error is None else scrubbed(error, route)


def admit_half(conn: AmqpConnection, link: Link, halves: dict[bool, PairHalf]) -> bool:
    """Judge a downstream half against the other half of its name (LP-5, LP-7): refuse it,
    or record it in ``halves`` (by our role) and say True."""
    remote = link.remote_attach
    assert remote is not None
    half = PairHalf.of(remote)
    refusal = judge_attach(half, known=True, pairs=True, opposite=halves.get(not link.role))
    if refusal is not None:
        conn.refuse(
            link,
            Error(refusal.condition, refusal.description),
            null_terminus=refusal.null_terminus,
            properties=paired_properties(),
        )
        return False
    halves[link.role] = half
    return True


class UpstreamPair:
    """The gateway's own pair to ``route``'s next hop: a new link name, the gateway's own
    terminus addresses, the next hop's address as the node, and on both attaches the
    ``caller`` it carries for, vouched (``pairlink:caller``). Its ends report to ``owner``,
    which calls ``changed()`` on every event so that ``open`` sees progress."""

    def __init__(
        self, route: Route, owner: LinkOwner, snd_settle_mode: int, caller: Identity
    ) -> None:
        self.route = route
        self.owner = owner
        self.snd_settle_mode = snd_settle_mode
        self.caller = caller
        self.sender: LinkEnd | None = None
        self.receiver: LinkEnd | None = None
        self.failure: Error | None = None
        self.lane: Lane | None = None  # where it went, once placed
        self._changed = trio.Event()

    def changed(self) -> None:
        self._changed.set()

    def ending(self, end: LinkEnd) -> Error | None:
        """What to tell downstream now that ``end`` is over (:func:`upstream_ending`); a
        replica that detached it because it stops gets no new pairs."""
        error = upstream_ending(end, self.route)
        if (
            self.lane is not None
            and error is not None
            and stopped(error.condition, error.description)
        ):
            self.lane.upstream.stopping()
        return error

    async def open(self, replicas: RouteReplicas, caller: Hashable, within: float) -> Error | None:
        """Attach on ``caller``'s lane to the replica the route picks, and wait for the answer
        (and the first credit, ``CREDIT_WAIT`` at most, if the lane waits for it); returns why
        it failed, None when it is up."""
        try:
            with trio.move_on_after(within) as scope:
                upstream = self.lane = await replicas.lane(caller)
                self._attach(*await upstream.place())
                await self._until(self._settled)
                if self.failure is None:
                    at_once = self._has_credit()
                    if not at_once and upstream.waits_for_credit:
                        with trio.move_on_after(CREDIT_WAIT):
                            await self._until(self._has_credit)
                    upstream.answered(at_once=at_once, credit=self._has_credit())
            if scope.cancelled_caught and self.failure is None:
                self.fail(Error(DETACH_FORCED, "the next hop did not answer the pair in time"))
        except UpstreamUnavailable:
            self.fail(
                Error(DETACH_FORCED, f"the next hop for {self.route.public!r} is unreachable")
            )
        return self.failure

    def _attach(self, conn: AmqpConnection, session: Session) -> None:
        name = conn.link_name("gw")
        address = self.route.address
        properties = {**paired_properties(), **self.caller.properties()}
        sender = conn.attach(
            session=session,
            name=name,
            role=ROLE_SENDER,
            source=Source(address=name),
            target=Target(address=address),
            snd_settle_mode=self.snd_settle_mode,
            properties=properties,
        )
        receiver = conn.attach(
            session=session,
            name=name,
            role=ROLE_RECEIVER,
            source=Source(address=address),
            target=Target(address=name),
            snd_settle_mode=self.snd_settle_mode,
            rcv_settle_mode=RCV_FIRST,
            properties=properties,
        )
        self.sender = LinkEnd(conn, sender, self.owner)
        self.receiver = LinkEnd(conn, receiver, self.owner)
        log.debug("upstream.pair", public=self.route.public, conn=conn.id, link=name)

    def _has_credit(self) -> bool:
        return self.sender is not None and self.sender.usable and self.sender.link.usable_credit > 0

    def _settled(self) -> bool:
        """Both halves answered and none refused, or the pair failed."""
        if self.failure is not None:
            return True
        sender, receiver = self.sender, self.receiver
        assert sender is not None and receiver is not None
        for end in (sender, receiver):
            if end.detached is not None or end.conn.closed.is_set():
                error = self.ending(end)
                self.fail(error or Error(DETACH_FORCED, "the next hop detached the pair"))
                return True
        if sender.link.remote_attach is None or receiver.link.remote_attach is None:
            return False
        if sender.link.remote_target is None or receiver.link.remote_source is None:
            return False  # refused: its detach (with the reason) comes right behind
        for end in (sender, receiver):
            if paired_mismatch(end.link.properties, end.link.remote_properties):  # LP-5
                self.fail(Error(PRECONDITION_FAILED, "the next hop answered without paired: true"))
                return True
        return True

    def fail(self, error: Error) -> None:
        if self.failure is None:
            self.failure = error
            log.info("upstream.pair_refused", public=self.route.public, condition=error.condition)
            self.detach(error)

    def detach(self, error: Error | None) -> None:
        """Detach both ends (those attached so far), closing them with ``error``."""
        for end in (self.sender, self.receiver):
            if end is not None:
                end.detach(error)

    async def _until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            self._changed = trio.Event()
            await self._changed.wait()


class PairRelay:
    """One downstream pair (link ``name`` on ``downstream``) and its upstream pair, which
    vouches for ``caller``."""

    def __init__(
        self,
        downstream: RelayOwner,
        route: Route,
        name: str,
        first: Link,
        lease: PairLease,
        caller: Identity,
    ) -> None:
        self.downstream = downstream
        self.route = route
        self.name = name
        self.lease = lease
        self.requests = Hop()  # downstream requester's sender -> upstream
        self.replies = Hop()  # upstream -> downstream requester's receiver
        self.halves: dict[bool, PairHalf] = {}  # by our role on the downstream link
        self.unanswered: dict[bool, Link] = {}
        self.failure: Error | None = None
        self.ready = False
        remote = first.remote_attach
        assert remote is not None
        self.upstream = UpstreamPair(route, self, remote.snd_settle_mode, caller)
        self._log = log.bind(conn=downstream.conn.id, link=name, public=route.public)
        self.add_half(first)

    # -- set-up ----------------------------------------------------------------------------

    def add_half(self, link: Link) -> None:
        """A downstream half arrived: judge it against the other (LP-5, LP-7), then answer
        it now if the upstream pair is settled, else when it is."""
        if not admit_half(self.downstream.conn, link, self.halves):
            return
        self.unanswered[link.role] = link
        if self.ready or self.failure is not None:
            self._answer()

    async def open(
        self, replicas: RouteReplicas, within: float, release: Callable[[], None]
    ) -> None:
        """Pair upstream on one of ``replicas``, then answer downstream; ``release`` lets the
        downstream connection's input flow again, whatever happened."""
        try:
            self.failure = await self.upstream.open(replicas, self.downstream.conn, within)
        except Exception:  # a bug of ours: this pair fails, the gateway's task logs it
            self.failure = Error(INTERNAL_ERROR, "the gateway could not pair upstream")
            raise
        except BaseException:  # cancelled: the gateway is stopping
            self.failure = Error(DETACH_FORCED, "the gateway is shutting down")
            raise
        finally:
            if self.failure is None:
                self.ready = True
                self.requests.outbound = self.upstream.sender
                receiver = self.replies.inbound = self.upstream.receiver
                assert receiver is not None  # (an upstream pair without failure has both)
                receiver.conn.pass_through(receiver.link, self.replies.pass_on)
            else:
                self._log.info("relay.refused", condition=self.failure.condition)
            self._answer()
            release()

    def _answer(self) -> None:
        """Answer the downstream halves that wait: as the upstream pair went."""
        conn = self.downstream.conn
        if conn.closed.is_set():  # the requester left while we paired: nobody to relay for
            self.unanswered.clear()
            if self.ready:
                self.upstream.detach(None)
        while self.unanswered:
            role, link = self.unanswered.popitem()
            if self.failure is not None:
                conn.refuse(link, self.failure)
                continue
            if role == ROLE_RECEIVER:
                conn.answer_attach(
                    link,
                    properties=paired_properties(),
                    rcv_settle_mode=RCV_FIRST,
                )
                self.requests.inbound = LinkEnd(conn, link, self)
                conn.pass_through(link, self.requests.pass_on)
                self.requests.mirror_credit()
            else:
                upstream = self.replies.inbound
                up_attach = upstream.link.remote_attach if upstream is not None else None
                conn.answer_attach(
                    link,
                    properties=paired_properties(),
                    snd_settle_mode=up_attach.snd_settle_mode if up_attach else SND_MIXED,
                )
                self.replies.outbound = LinkEnd(conn, link, self)
                self.replies.mirror_credit()
        if self.failure is not None and len(self.halves) == 2:
            self.downstream.forget(self)

    def release(self) -> None:
        """The pair is over, or its connection is: it no longer counts against ``max_pairs``."""
        self.lease.release()

    # -- link events (LinkOwner) ------------------------------------------------------------

    def _hop_of(self, end: LinkEnd) -> Hop:
        return (
            self.requests
            if end in (self.requests.inbound, self.requests.outbound)
            else (self.replies)
        )

    def link_attached(self, end: LinkEnd) -> None:
        self.upstream.changed()

    def link_flowed(self, end: LinkEnd) -> None:
        self.upstream.changed()
        if not self.ready:
            return
        hop = self._hop_of(end)
        if end is hop.outbound:
            hop.pump()
            hop.answer_drain()
            hop.mirror_credit()
        elif end is hop.inbound:  # it answered a drain: grant what the other side allows
            hop.mirror_credit()

    def link_received(self, end: LinkEnd, delivery: Delivery, payload: bytes) -> None:
        self._hop_of(end).arrive(delivery, payload)

    def link_updated(self, end: LinkEnd, delivery: Delivery) -> None:
        hop = self._hop_of(end)
        if end is hop.outbound:
            hop.outcome(delivery)

    def link_ended(self, end: LinkEnd) -> None:
        self.upstream.changed()
        if not self.ready:
            return
        hop = self._hop_of(end)
        upstream_side = end.conn is not self.downstream.conn
        partner = hop.inbound if end is hop.outbound else hop.outbound
        if end is hop.outbound:
            hop.abandon()
        if partner is not None:
            partner.detach(self.upstream.ending(end) if upstream_side else end.ending_error())
        if self._all_over():
            self.downstream.forget(self)

    def _all_over(self) -> bool:
        ends = (self.requests.inbound, self.requests.outbound)
        ends2 = (self.replies.inbound, self.replies.outbound)
        return all(end is None or not end.usable for end in (*ends, *ends2))
