"""The gateway's routing node (LP-9): a paired link with anonymous termini that routes each
request by its ``to``.

Each public address a request names gets its own upstream pair (a *leg*, opened on first use
and kept while the node's pair lives); replies from every leg come back on the one downstream
reply link. The node cannot know a request's destination before it arrives, so it grants a
fixed window (``ROUTING_CREDIT``) less what waits for a leg: memory stays bounded by that
window, and a request for a leg that is slow or still opening waits here without blocking the
others. A ``to`` that names no route, or one the peer may not use, is rejected with
``amqp:not-found`` / ``amqp:unauthorized-access``; a pre-settled request cannot be rejected, so
the node's request link is detached with that error instead (Anonymous Terminus 2.2.2).
"""

from __future__ import annotations

from pairlink._amqp.errors import (
    INVALID_FIELD,
    NOT_FOUND,
    RESOURCE_LIMIT_EXCEEDED,
    UNAUTHORIZED_ACCESS,
    DecodeError,
)
from pairlink._amqp.link import Delivery, Link
from pairlink._amqp.messaging import Error, Message, Rejected
from pairlink._amqp.performatives import RCV_FIRST, ROLE_RECEIVER
from pairlink._gateway.config import Route
from pairlink._gateway.pairs import (
    PairLease,
    RelayContext,
    RelayOwner,
    UpstreamPair,
    admit_half,
)
from pairlink._gateway.relay import Hop
from pairlink._gateway.replicas import RouteReplicas
from pairlink._io.links import LinkEnd
from pairlink._rpc.caller import Identity
from pairlink._rpc.linkpair import PairHalf, paired_properties
from pairlink._telemetry.logs import get_logger

log = get_logger("pairlink.gateway")

ROUTING_CREDIT = 100


class _Leg:
    """The upstream pair one routing node uses for one route."""

    def __init__(
        self, route: Route, node: RoutingRelay, snd_settle_mode: int, lease: PairLease
    ) -> None:
        self.route = route
        self.lease = lease
        self.upstream = UpstreamPair(route, node, snd_settle_mode, node.caller)
        self.requests = Hop(inbound=node.inbound)
        self.replies = Hop(outbound=node.outbound)
        self.ready = False


class RoutingRelay:
    """A downstream pair with anonymous termini (link ``name``) and its legs by route, on
    the routes, pair budget and upstreams of ``context``; each leg vouches for ``caller``."""

    def __init__(
        self,
        downstream: RelayOwner,
        context: RelayContext,
        name: str,
        first: Link,
        lease: PairLease,
        caller: Identity,
    ) -> None:
        self.downstream = downstream
        self.caller = caller
        self.context = context
        self.name = name
        self.lease = lease
        self.halves: dict[bool, PairHalf] = {}
        self.inbound: LinkEnd | None = None  # the requester's sender: requests
        self.outbound: LinkEnd | None = None  # the requester's receiver: replies
        self.legs: dict[str, _Leg] = {}
        remote = first.remote_attach
        assert remote is not None
        self.snd_settle_mode = remote.snd_settle_mode
        self._log = log.bind(conn=downstream.conn.id, link=name, routing=True)
        self.add_half(first)

    def add_half(self, link: Link) -> None:
        """Answer a half at once: the node itself is here (LP-5 and LP-7 still apply)."""
        conn = self.downstream.conn
        if not admit_half(conn, link, self.halves):
            return
        if link.role == ROLE_RECEIVER:
            conn.answer_attach(
                link,
                properties=paired_properties(),
                rcv_settle_mode=RCV_FIRST,
            )
            self.inbound = LinkEnd(conn, link, self)
            for leg in self.legs.values():
                leg.requests.inbound = self.inbound
            self._grant()
        else:
            conn.answer_attach(link, properties=paired_properties())
            self.outbound = LinkEnd(conn, link, self)
            for leg in self.legs.values():
                leg.replies.outbound = self.outbound

    # -- requests --------------------------------------------------------------------------

    def _grant(self) -> None:
        """Top the request window up once half of it is used."""
        inbound = self.inbound
        if inbound is None or not inbound.usable:
            return
        waiting = sum(len(leg.requests.waiting) for leg in self.legs.values())
        if inbound.link.link_credit + waiting <= ROUTING_CREDIT // 2:
            inbound.conn.flow(inbound.link, ROUTING_CREDIT - waiting)

    def _route(self, delivery: Delivery, payload: bytes) -> None:
        try:
            message = Message.decode(payload)
        except DecodeError as exc:
            self._unroutable(delivery, INVALID_FIELD, f"undecodable message: {exc}")
            return
        to: object = message.properties.to if message.properties else None
        context = self.context
        route = context.routes.get(to) if isinstance(to, str) else None
        if route is None:
            self._unroutable(delivery, NOT_FOUND, f"no route for to={to!r}")
            return
        if not self.downstream.may_use(route):
            self._unroutable(delivery, UNAUTHORIZED_ACCESS, f"{route.public!r} is not allowed")
            return
        leg = self.legs.get(route.public)
        if leg is None:
            lease = context.pairs.take(self.downstream.user, self.downstream)
            if isinstance(lease, str):
                self._unroutable(delivery, RESOURCE_LIMIT_EXCEEDED, lease)
                return
            leg = _Leg(route, self, self.snd_settle_mode, lease)
            self.legs[route.public] = leg
            context.start_soon(self._open_leg, leg, context.upstreams[route.public])
        leg.requests.arrive(delivery, payload)

    def _unroutable(self, delivery: Delivery, condition: str, why: str) -> None:
        self._log.info("routing.unroutable", condition=condition, why=why)
        inbound = self.inbound
        assert inbound is not None
        if delivery.settled:  # no outcome can be said: the link goes, with the reason
            inbound.detach(Error(condition, why))
        else:
            inbound.conn.settle(delivery, Rejected(error=Error(condition, why)))

    async def _open_leg(self, leg: _Leg, replicas: RouteReplicas) -> None:
        failure = await leg.upstream.open(
            replicas, self.downstream.conn, self.context.attach_timeout
        )
        if self.legs.get(leg.route.public) is not leg:  # the node ended while it opened
            leg.upstream.detach(None)
            return
        if failure is not None:
            self._drop_leg(leg)
            self._fail_waiting(leg, failure)
            return
        leg.ready = True
        leg.requests.outbound = leg.upstream.sender
        leg.replies.inbound = leg.upstream.receiver
        leg.requests.pump()
        leg.replies.mirror_credit()
        self._grant()

    def _drop_leg(self, leg: _Leg) -> None:
        del self.legs[leg.route.public]
        leg.lease.release()

    def release(self) -> None:
        """The node is over, or its connection is: neither it nor its legs count against
        ``max_pairs`` any more."""
        self.lease.release()
        for leg in self.legs.values():
            leg.lease.release()

    def _fail_waiting(self, leg: _Leg, error: Error) -> None:
        while leg.requests.waiting:
            delivery = leg.requests.waiting.popleft().delivery
            self._unroutable(delivery, str(error.condition), error.description or "")
        self._grant()

    # -- link events (LinkOwner) ------------------------------------------------------------

    def _leg_of(self, end: LinkEnd) -> _Leg | None:
        for leg in self.legs.values():
            if end is leg.upstream.sender or end is leg.upstream.receiver:
                return leg
        return None

    def link_attached(self, end: LinkEnd) -> None:
        found = self._leg_of(end)
        if found is not None:
            found.upstream.changed()

    def link_flowed(self, end: LinkEnd) -> None:
        if end is self.outbound:
            for leg in self.legs.values():
                leg.replies.pump()
            if not any(leg.replies.waiting for leg in self.legs.values()):
                end.conn.complete_drain(end.link)  # a no-op unless the caller drains
            for leg in self.legs.values():
                leg.replies.mirror_credit()
            return
        found = self._leg_of(end)
        if found is None:
            return
        leg = found
        leg.upstream.changed()
        if leg.ready and end is leg.requests.outbound:
            leg.requests.pump()
            leg.requests.answer_drain()
            self._grant()
        elif leg.ready and end is leg.replies.inbound:  # it answered a drain
            leg.replies.mirror_credit()

    def link_received(self, end: LinkEnd, delivery: Delivery, payload: bytes) -> None:
        if end is self.inbound:
            self._route(delivery, payload)
            self._grant()
            return
        found = self._leg_of(end)
        if found is not None:
            found.replies.arrive(delivery, payload)

    def link_updated(self, end: LinkEnd, delivery: Delivery) -> None:
        if end is self.outbound:
            for leg in self.legs.values():
                if delivery in leg.replies.forwarded:
                    leg.replies.outcome(delivery)
                    return
            return
        found = self._leg_of(end)
        if found is not None and end is found.requests.outbound:
            found.requests.outcome(delivery)

    def link_ended(self, end: LinkEnd) -> None:
        if end is self.inbound or end is self.outbound:
            for leg in list(self.legs.values()):
                for upstream_end in (leg.upstream.sender, leg.upstream.receiver):
                    if upstream_end is not None:
                        upstream_end.detach(end.ending_error())
            if not any(e is not None and e.usable for e in (self.inbound, self.outbound)):
                self.downstream.forget(self)  # which releases the legs' places too
                self.legs.clear()
            return
        found = self._leg_of(end)
        if found is None:
            return
        leg = found
        leg.upstream.changed()
        if not leg.ready:
            return
        # a leg is over: what it owed is released, and the next request for it opens anew
        self._drop_leg(leg)
        error = leg.upstream.ending(end)
        leg.requests.abandon()
        leg.replies.abandon()
        self._fail_waiting(leg, error or Error(NOT_FOUND, "the next hop detached"))
        for other in (leg.upstream.sender, leg.upstream.receiver):
            if other is not None:
                other.detach(error)
