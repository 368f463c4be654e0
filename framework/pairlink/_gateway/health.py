"""A gateway's own ``$health`` node (the wire form: :mod:`pairlink._client.health`), so that
``pairlink health`` and orchestrators probe a gateway as they probe a server.

A pair a peer opens to ``$health`` is answered here, never relayed: ``check`` says
``serving``, or, naming one of the gateway's routes, ``serving`` while one of that route's next
hops (replicas) takes new pairs and a 503 while none does (the gateway is up, but the route is
broken); a route of several replicas also says each one's state, in its config's order
(``replicas``: ``ready``, ``connecting``, ``draining`` or ``lost``; no address); a route the
peer's user may not use (its ``allow`` list) is a 404, as an unknown name is. Such a pair
takes no place in ``max_pairs``: nothing is carried, and what a peer can hold here is bounded
by the credit of its request link.
"""

from __future__ import annotations

from pairlink._amqp.errors import DECODE_ERROR
from pairlink._amqp.link import Delivery, Link
from pairlink._amqp.messaging import Accepted, Error, Message, Rejected
from pairlink._amqp.performatives import RCV_FIRST, ROLE_RECEIVER, SND_SETTLED, SND_UNSETTLED
from pairlink._client.health import CHECK, SERVING
from pairlink._gateway.pairs import RelayContext, RelayOwner, admit_half
from pairlink._io.links import LinkEnd, LinkOwner, Receiver, Sender, accept_receiver, accept_sender
from pairlink._rpc import wire
from pairlink._rpc.deadline import wall_time
from pairlink._rpc.linkpair import PairHalf, paired_properties
from pairlink._rpc.wire import ME, NOT_FOUND, UNAVAILABLE
from pairlink.errors import CallError, ConnectionLostError, LinkDetachedError

HEALTH_CREDIT = 4
"""Health requests one pair may have waiting for their answer."""


class HealthPair(LinkOwner):
    """A downstream pair at ``$health`` (link ``name``): its requests answered by the
    gateway itself, on the routes and upstreams of ``context``."""

    def __init__(
        self, downstream: RelayOwner, context: RelayContext, name: str, first: Link
    ) -> None:
        self.downstream = downstream
        self.context = context
        self.name = name
        self.halves: dict[bool, PairHalf] = {}
        self.requests: Receiver | None = None
        self.replies: Sender | None = None
        self.add_half(first)

    def add_half(self, link: Link) -> None:
        conn = self.downstream.conn
        if not admit_half(conn, link, self.halves):
            return
        if link.role == ROLE_RECEIVER:
            self.requests = accept_receiver(
                conn,
                link,
                credit=HEALTH_CREDIT,
                watcher=self,
                properties=paired_properties(),
                rcv_settle_mode=RCV_FIRST,
            )
        else:
            self.replies = accept_sender(conn, link, watcher=self, properties=paired_properties())
        if self.requests is not None and self.replies is not None:
            self.context.start_soon(self._answer, self.requests, self.replies)

    def release(self) -> None:
        """Nothing to give back: a health pair holds no place in the pair budget."""

    def link_updated(self, end: LinkEnd, delivery: Delivery) -> None:
        # the requester decided on a reply but left settling it to us (rcv-settle-mode second)
        if delivery.remote_state is not None and not delivery.remote_settled and end.usable:
            end.conn.settle(delivery, delivery.remote_state)

    def link_ended(self, end: LinkEnd) -> None:
        self.downstream.forget(self)

    async def _answer(self, requests: Receiver, replies: Sender) -> None:
        """Answer each request in turn, until either half of the pair is gone."""
        mode = replies.end.link.snd_settle_mode
        presettle = {SND_SETTLED: True, SND_UNSETTLED: False}.get(mode)  # None: mixed
        async for received in requests:
            delivery = received.delivery
            try:
                request = wire.parse_request(received.message, now=wall_time())
            except CallError as exc:  # no request to address a reply to: refuse it
                requests.settle(received, Rejected(error=Error(DECODE_ERROR, exc.description)))
                continue
            if not delivery.remote_settled:
                requests.settle(received, Accepted())
            settled = delivery.remote_settled if presettle is None else presettle
            try:
                await replies.send(self._reply(request), settled=settled, wait=False)
            except (ConnectionLostError, LinkDetachedError):
                return

    def _reply(self, request: wire.Request) -> Message | bytes:
        try:
            value = self._check(request)
        except CallError as exc:
            return wire.error_message(request, exc.status, exc.description, to=ME)
        return wire.encode_reply(request, value, to=ME)

    def _check(self, request: wire.Request) -> dict[str, object]:
        if request.operation != CHECK:
            raise CallError(NOT_FOUND, f"the health node has no operation {request.operation!r}")
        service: object = request.kwargs.get("service", request.args[0] if request.args else "")
        if not isinstance(service, str) or len(request.args) + len(request.kwargs) > 1:
            raise CallError(wire.BAD_REQUEST, "check takes one optional route name")
        if service:
            route = self.context.routes.get(service)
            replicas = self.context.upstreams.get(service)
            if route is None or replicas is None or not self.downstream.may_use(route):
                # a route this user may not use does not exist for it: no state, no hint
                raise CallError(NOT_FOUND, f"no route at the address {service!r}")
            if not replicas.serving:
                raise CallError(UNAVAILABLE, f"the next hop of {service!r} is unreachable")
            if len(replicas.upstreams) > 1:
                return {"status": SERVING, "replicas": replicas.states()}
        return {"status": SERVING}
