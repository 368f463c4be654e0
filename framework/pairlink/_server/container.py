"""The service container: which links it accepts, where replies go, and how it shuts down.

Links. A peer's sending link to a service address carries requests (a :class:`RequestLink`,
fed into that service's actor); a peer's receiving link carries replies (a :class:`ReplyLink`).
Each attach is judged by the pairing rules (``linkpair.judge_attach``) and answered with exactly
the frames they name: unknown address, null terminus + ``detach(closed, amqp:not-found)``; a
paired attach to an address that does not pair (LP-6), null terminus + ``not-implemented``;
halves of one name that disagree (LP-5) or do not mirror each other (LP-7), an attach then
``detach(closed, precondition-failed)``. A paired answer carries ``{paired: true}`` (LP-4).

Reply routing (LP-8), always on the connection the request came in on:

* ``reply-to = "$me"`` on a paired request link: on its paired half, with ``to = "$me"``;
* any other ``reply-to``: on a reply link the requester attached whose target is that address
  (the AMQP-management pattern), or on a dynamic node we created for it: a receiving link with
  a dynamic source gets the address ``<container-id>/dyn/<n>`` (Proton's classic client);
  else on the unpaired reply link *named* that (@azure/core-amqp's ``$cbs`` link, which has no
  target; Erlang's amqp10_client);
* no ``reply-to`` on an unpaired link: on the one unpaired receiving link the requester
  attached from that service (azure-eventhub's put-token); with two or more, it is ambiguous
  and refused (``amqp:invalid-field``), as is one without reply-to on a pair;
* nothing matches: the request is ``Rejected`` (``amqp:not-found``, ``amqp:invalid-field``), or,
  when it came pre-settled and no outcome can be said, logged as ``call.undeliverable`` and
  dropped. The handler never runs for a request whose answer could not be delivered.

Replies follow the settle mode the requester's receiving link asked for: pre-settled for
``settled``, unsettled for ``unsettled``, and for ``mixed`` (the default, what a Proton
``BlockingConnection`` receiver asks for) as its request came: a client that sent its request
unsettled settles what it receives itself (``receive()`` then ``accept()``), and a settled
reply would leave it nothing to settle. A reply that finds no credit waits on its link, still
holding its mailbox slot, so a requester that stops granting reply credit only slows itself and
the service it calls, and never makes a buffer grow.

Credit (:mod:`pairlink._server.mailbox`). A request link gets credit only from its service's free
mailbox slots, shared per connection and then per link, and the credit goes out as the link is
attached, before any later frame of the connection is read: a pipelined first call (LP-10) finds
it whenever the mailbox has room. When it has none (every slot held by calls or promised to other
callers), the link is attached with no credit, and a request sent on it anyway is refused as
LP-10 says: the engine detaches the link with ``amqp:link:transfer-limit-exceeded`` when the
transfer arrives (a transfer beyond credit is never held); the caller may attach again and wait
for credit. Credit is taken back with a drain, never by lowering it, so a transfer that was
already on its way when credit was taken back is still answered.

Callers. A request link's caller is its connection's SASL user, unless that user is one the
server trusts to vouch for its callers (``vouching_users``, a gateway's) and the attach names
one (``pairlink:caller``, :mod:`pairlink._rpc.caller`): then it is the caller named. The dedup
store keeps replies per caller, and handlers see it as ``current_call().user``. A claim from a
user not trusted is ignored (logged at debug); a malformed one from a trusted user refuses the
link with ``amqp:invalid-field``.

``RequestLink`` and ``ReplyLink`` own their link ends (:class:`pairlink._io.links.LinkOwner`)
and hear each link's events (message, flow, outcome, detach): the credit and the queueing are
the actor's, not a ready-made receiver's or sender's.
"""

from __future__ import annotations

import copy
import itertools
from collections import deque
from collections.abc import Collection
from typing import Unpack

import attrs

from pairlink._amqp.errors import (
    INVALID_FIELD,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    RESOURCE_LIMIT_EXCEEDED,
)
from pairlink._amqp.link import Delivery, Link
from pairlink._amqp.messaging import DeliveryState, Error
from pairlink._amqp.performatives import (
    RCV_FIRST,
    ROLE_RECEIVER,
    ROLE_SENDER,
    SND_MIXED,
    SND_SETTLED,
    SND_UNSETTLED,
)
from pairlink._config.limits import MAX_LINKS_TOTAL
from pairlink._io.connection import AmqpConnection
from pairlink._io.facade import AcceptFields
from pairlink._io.links import LinkEnd, LinkOwner, accept
from pairlink._rpc.caller import Identity, InvalidClaim, judge_caller
from pairlink._rpc.linkpair import (
    PairHalf,
    Refusal,
    judge_attach,
    paired_properties,
)
from pairlink._rpc.wire import ME
from pairlink._server.actor import Actor
from pairlink._server.calls import Origin
from pairlink._server.link_budget import LinkBudget
from pairlink._telemetry.logs import get_logger
from pairlink.errors import PairlinkError

log = get_logger("pairlink.service")


class RequestLink(LinkOwner):
    """A peer's sending link to a service: each message is a call for ``actor``. Created
    answering the peer's attach (``answer``: the fields of our attach)."""

    def __init__(
        self,
        conn: AmqpConnection,
        link: Link,
        actor: Actor,
        peer: Peer,
        half: PairHalf,
        caller: Identity,
        **answer: Unpack[AcceptFields],
    ) -> None:
        self.actor = actor
        self.ledger = actor.mailbox.ledger(conn, link)  # its credit, as the mailbox counts it
        self.peer = peer
        self.caller = caller
        self.half = half
        self.pair: ReplyLink | None = None  # the paired half, once both are attached
        self.end = accept(conn, link, self, **answer)

    @property
    def link(self) -> Link:
        return self.end.link

    @property
    def usable(self) -> bool:
        return self.end.usable

    def set_credit(self, credit: int) -> None:
        """Set the link's credit (a flow frame)."""
        if self.end.usable:
            self.end.conn.flow(self.end.link, credit)

    def drain(self, credit: int) -> None:
        """Ask the sender to use its ``credit`` now or give it back (a flow with drain)."""
        if self.end.usable:
            self.end.conn.flow(self.end.link, credit, drain=True)

    def describe(self) -> str:
        conn = self.end.conn
        user = conn.sasl_identity or "-"
        return f"conn {conn.id} peer {conn.peer} user {user} link {self.end.link.name}"

    def revoke(self, error: Error) -> None:
        """The mailbox takes back the credit of this link, which ignored a drain: detached
        with ``error``, and the holder named in the log."""
        if self.end.usable:
            conn = self.end.conn
            log.warning(
                "credit.revoked",
                service=self.actor.address,
                conn=conn.id,
                peer=conn.peer,
                user=conn.sasl_identity,
                link=self.end.link.name,
                credit=self.ledger.granted,
            )
            conn.detach(self.end.link, error=error)

    def release(self) -> None:
        """A call that came on this link no longer holds its mailbox slot: the one place a
        slot is freed (the mailbox's, which grants it again, or ends a drain)."""
        self.actor.mailbox.release(self.ledger.caller)

    def set_outcome(self, delivery: Delivery, state: DeliveryState) -> None:
        """Say the outcome (Accepted, Rejected) of an unsettled request."""
        if self.end.usable:
            self.end.conn.settle(delivery, state)

    def route_for(self, reply_to: object) -> ReplyLink | None:
        """Where the reply to a request with this ``reply-to`` goes (LP-8, then the reply
        idioms of the module docstring), or None if nowhere. (Typed ``str`` in a message, but
        decoded as whatever the peer put there.)"""
        if reply_to == ME:
            route = self.pair
        elif isinstance(reply_to, str):
            route = self.peer.routes.get(reply_to) or self.peer.named(reply_to)
        elif reply_to is None and not self.half.paired:
            route = self.peer.sole_listener(self.actor.address)
        else:  # a peer's value of another type; or no reply-to on a pair (LP-8 wants $me)
            return None
        return route if route is not None and route.end.usable else None

    def why_unroutable(self, reply_to: object) -> tuple[str, str]:
        if reply_to is None:
            if self.half.paired:
                return INVALID_FIELD, "the request has no reply-to"
            node = self.actor.address
            found = len(self.peer.listeners.get(node, ()))
            if found:
                why = f"{found} receiving links of this connection come from {node!r}"
            else:
                why = f"no receiving link of this connection comes from {node!r}"
            return INVALID_FIELD, f"the request has no reply-to, and {why}: name one"
        if not isinstance(reply_to, str):
            return INVALID_FIELD, f"reply-to {reply_to!r} is not an address"
        if reply_to == ME:
            return NOT_FOUND, "reply-to $me, but this link has no attached paired link"
        return (
            NOT_FOUND,
            f"no receiving link of this connection has the target or name {reply_to!r}",
        )

    def link_received(self, end: LinkEnd, delivery: Delivery, payload: bytes) -> None:
        self.actor.arrive(self, delivery, payload)

    def link_flowed(self, end: LinkEnd) -> None:
        self.actor.mailbox.flowed(self)  # answering a drain, the sender may return credit

    def link_ended(self, end: LinkEnd) -> None:
        self.actor.link_gone(self)
        self.peer.forget(self)


class ReplyLink(LinkOwner):
    """A peer's receiving link: replies go out on it as its credit allows. Created answering
    the peer's attach (``answer``: the fields of our attach)."""

    def __init__(
        self,
        conn: AmqpConnection,
        link: Link,
        peer: Peer,
        half: PairHalf,
        to: str | None,
        **answer: Unpack[AcceptFields],
    ) -> None:
        self.peer = peer
        self.half = half
        self.to = to  # the reply's `to`: "$me" on a pair, else the address routed to
        # the service it comes from, when unpaired and not dynamic: routed to by name, or as
        # that service's only reply link
        remote = link.remote_attach
        dynamic = remote is not None and remote.source is not None and remote.source.dynamic
        self.node = None if half.paired or dynamic else half.source
        mode = SND_MIXED if remote is None else remote.snd_settle_mode
        self.presettle = {SND_SETTLED: True, SND_UNSETTLED: False}.get(mode)  # None: mixed
        # the reply, the request's link, and whether the request came settled
        self._parked: deque[tuple[bytes, Origin, bool]] = deque()
        self.end = accept(conn, link, self, **answer)

    @property
    def link(self) -> Link:
        return self.end.link

    @property
    def usable(self) -> bool:
        return self.end.usable

    @property
    def parked(self) -> int:
        """Replies waiting for the requester's credit."""
        return len(self._parked)

    def deliver(
        self, payload: bytes, origin: Origin, request_settled: bool, through: bool = False
    ) -> None:
        """Send a reply to a call that came on ``origin`` now, or park it until credit comes
        (it keeps its mailbox slot until then); in mixed mode it goes settled as the request
        came (``request_settled``); ``through``: a lone reply, written from here if the writer
        is idle. The caller checked that the link is usable."""
        if self.end.link.usable_credit > 0 and not self._parked:
            self._send_now(payload, request_settled, through)
            origin.release()
        else:
            self._parked.append((payload, origin, request_settled))

    def _send_now(self, payload: bytes, request_settled: bool, through: bool = False) -> None:
        settled = request_settled if self.presettle is None else self.presettle
        try:
            self.end.conn.send(self.end.link, payload, settled=settled, through=through)
        except PairlinkError as exc:  # the link or connection is closing
            log.warning(
                "reply.dropped", conn=self.end.conn.id, link=self.end.link.name, error=str(exc)
            )

    def link_flowed(self, end: LinkEnd) -> None:
        while self._parked and end.link.usable_credit > 0 and end.usable:
            payload, origin, request_settled = self._parked.popleft()
            self._send_now(payload, request_settled)
            origin.release()
        if end.link.drain and not self._parked:  # no reply waits: the credit is used up
            end.conn.complete_drain(end.link)

    def link_updated(self, end: LinkEnd, delivery: Delivery) -> None:
        # the requester decided but left settling to us (rcv-settle-mode second)
        decided = delivery.remote_state is not None and not delivery.remote_settled
        if decided and end.usable:
            end.conn.settle(delivery, delivery.remote_state)

    def link_ended(self, end: LinkEnd) -> None:
        if self._parked:
            log.warning(
                "reply.undeliverable",
                conn=end.conn.id,
                link=end.link.name,
                dropped=len(self._parked),
            )
        while self._parked:
            _payload, origin, _settled = self._parked.popleft()
            origin.release()
        self.peer.forget(self)


ServedLink = RequestLink | ReplyLink
"""Either half of a pair (or a lone link) as the container serves it."""


@attrs.define(eq=False)
class Peer:
    """What the container knows about one connection: its links by (name, our role), for
    the pairing rules; its reply routes by target address, for LP-8; and its unpaired reply
    links by the service node they come from, for a request without reply-to. Each link is
    counted in the server's ``budget``."""

    conn: AmqpConnection
    budget: LinkBudget
    halves: dict[tuple[str, bool], ServedLink] = attrs.field(factory=dict)
    routes: dict[str, ReplyLink] = attrs.field(factory=dict)
    listeners: dict[str, list[ReplyLink]] = attrs.field(factory=dict)

    def add(self, endpoint: ServedLink) -> None:
        self.budget.take(self.conn.sasl_identity)
        self.halves[(endpoint.link.name, endpoint.link.role)] = endpoint
        if isinstance(endpoint, ReplyLink):
            if endpoint.to not in (None, ME):
                assert endpoint.to is not None
                self.routes[endpoint.to] = endpoint
            node = endpoint.node
            if node is not None:
                self.listeners.setdefault(node, []).append(endpoint)

    def forget(self, endpoint: ServedLink) -> None:
        key = (endpoint.link.name, endpoint.link.role)
        if self.halves.get(key) is endpoint:
            del self.halves[key]
            self.budget.give_back(self.conn.sasl_identity)
        if isinstance(endpoint, ReplyLink):
            if endpoint.to is not None and self.routes.get(endpoint.to) is endpoint:
                del self.routes[endpoint.to]
            node = endpoint.node
            if node is not None and endpoint in self.listeners.get(node, ()):
                listening = self.listeners[node]
                listening.remove(endpoint)
                if not listening:
                    del self.listeners[node]
            partner = self.halves.get((endpoint.link.name, ROLE_RECEIVER))
            if isinstance(partner, RequestLink) and partner.pair is endpoint:
                partner.pair = None

    def named(self, name: str) -> ReplyLink | None:
        """The unpaired reply link called ``name`` (a reply-to naming a link, not an address:
        @azure/core-amqp's ``$cbs`` link, Erlang's amqp10_client); a pair's half answers only
        ``$me`` (LP-8)."""
        found = self.halves.get((name, ROLE_SENDER))
        return found if isinstance(found, ReplyLink) and found.node is not None else None

    def sole_listener(self, node: str) -> ReplyLink | None:
        """The one unpaired reply link from service ``node``, for a request without reply-to
        (azure-eventhub's put-token); None when there is none, or more than one to choose."""
        found = self.listeners.get(node)
        return found[0] if found is not None and len(found) == 1 else None

    def endpoints(self) -> list[ServedLink]:
        return list(self.halves.values())


class Container:
    """The services of a server by address, and the judge of every link a peer opens: the
    pairing rules, then a :class:`RequestLink` fed to the service's actor or a
    :class:`ReplyLink` its replies go out on."""

    def __init__(
        self,
        actors: dict[str, Actor],
        container_id: str,
        max_links_total: int = MAX_LINKS_TOTAL,
        vouching_users: Collection[str] = frozenset(),
    ) -> None:
        self.actors = actors
        self.container_id = container_id
        self.vouching_users = frozenset(vouching_users)
        self.links = LinkBudget(max_links_total)
        self.log = log.bind(container=container_id)
        self._dynamic = itertools.count(1)

    # -- attaches --------------------------------------------------------------------------

    def on_attach(self, peer: Peer, link: Link) -> None:
        """Answer a link the peer opened (called before any later frame is read, so the
        credit granted here is on the wire before a pipelined request arrives: LP-10)."""
        remote = link.remote_attach
        assert remote is not None
        half = PairHalf.of(remote)
        why = self.links.refusal(peer.conn.sasl_identity, len(peer.halves))
        if why is not None:
            refusal = Refusal(RESOURCE_LIMIT_EXCEEDED, why, null_terminus=True)
            self._refuse(peer, link, half, refusal)
            return
        other = peer.halves.get((link.name, not link.role))
        opposite = other.half if other is not None else None
        if link.is_receiver:
            self._attach_requests(peer, link, half, opposite, other)
        else:
            self._attach_replies(peer, link, half, opposite, other)

    def _attach_requests(
        self,
        peer: Peer,
        link: Link,
        half: PairHalf,
        opposite: PairHalf | None,
        other: ServedLink | None,
    ) -> None:
        remote = link.remote_attach
        assert remote is not None
        target = remote.target
        if target is None or target.dynamic or half.target is None:
            why = "no anonymous or dynamic target here: send to a service address"
            self._refuse(peer, link, half, Refusal(NOT_IMPLEMENTED, why, null_terminus=True))
            return
        actor = self.actors.get(half.target)
        refusal = judge_attach(
            half,
            known=actor is not None,
            pairs=actor is not None and actor.pairing,
            opposite=opposite,
            address=half.target,
        )
        if refusal is not None:
            self._refuse(peer, link, half, refusal)
            return
        assert actor is not None
        caller = self._caller(peer, link, half)
        if caller is None:
            return
        endpoint = RequestLink(
            peer.conn,
            link,
            actor,
            peer,
            half,
            caller,
            target=target,
            properties=paired_properties() if half.paired else None,
            rcv_settle_mode=RCV_FIRST,  # we settle requests ourselves, at once
        )
        peer.add(endpoint)
        if half.paired and isinstance(other, ReplyLink):
            endpoint.pair = other
        actor.attach_link(endpoint)

    def _attach_replies(
        self,
        peer: Peer,
        link: Link,
        half: PairHalf,
        opposite: PairHalf | None,
        other: ServedLink | None,
    ) -> None:
        remote = link.remote_attach
        assert remote is not None
        source = remote.source
        dynamic = source is not None and source.dynamic
        if dynamic:  # a node of ours, for this link only: it exists, and does not pair
            refusal = judge_attach(half, known=True, pairs=False, opposite=opposite)
        else:
            actor = self.actors.get(half.source) if half.source is not None else None
            refusal = judge_attach(
                half,
                known=actor is not None,
                pairs=actor is not None and actor.pairing,
                opposite=opposite,
                address=half.source,
            )
        if refusal is not None:
            self._refuse(peer, link, half, refusal)
            return
        to = half.target
        if dynamic:
            assert source is not None
            to = f"{self.container_id}/dyn/{next(self._dynamic)}"
            source = copy.copy(source)  # the peer's attach stays as it was sent
            source.address = to
        elif half.paired:
            to = ME
        endpoint = ReplyLink(
            peer.conn,
            link,
            peer,
            half,
            to,
            source=source,
            properties=paired_properties() if half.paired else None,
        )
        peer.add(endpoint)
        if half.paired and isinstance(other, RequestLink):
            other.pair = endpoint

    def _caller(self, peer: Peer, link: Link, half: PairHalf) -> Identity | None:
        """Who calls on a request link (see the module docstring); None: the link is refused."""
        user = peer.conn.sasl_identity
        remote = link.remote_attach
        assert remote is not None
        try:
            caller, ignored = judge_caller(user, remote.properties, self.vouching_users)
        except InvalidClaim as exc:
            self._refuse(peer, link, half, Refusal(INVALID_FIELD, str(exc), null_terminus=False))
            return None
        if ignored:
            self.log.debug("caller.claim_ignored", conn=peer.conn.id, link=link.name, user=user)
        return caller

    def _refuse(self, peer: Peer, link: Link, half: PairHalf, refusal: Refusal) -> None:
        self.log.info(
            "link.refused",
            conn=peer.conn.id,
            link=link.name,
            source=half.source,
            target=half.target,
            paired=half.paired,
            condition=refusal.condition,
        )
        peer.conn.refuse(
            link,
            Error(refusal.condition, refusal.description),
            null_terminus=refusal.null_terminus,
            properties=paired_properties() if half.paired else None,
        )
