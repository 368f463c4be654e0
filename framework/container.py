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
* nothing matches: the request is ``Rejected(amqp:not-found)``, or, when it came pre-settled and
  no outcome can be said, logged as ``call.undeliverable`` and dropped. The handler never runs
  for a request whose answer could not be delivered.

Replies follow the settle mode the requester's receiving link asked for (pre-settled unless it
asked for ``unsettled``). A reply that finds no credit waits on its link, still holding its
mailbox slot, so a requester that stops granting reply credit only slows itself and the service
it calls, and never makes a buffer grow.

Credit (:mod:`framework.mailbox`). A request link gets credit only from its service's free
mailbox slots, shared per connection and then per link, and the credit goes out as the link is
attached, before any later frame of the connection is read: a pipelined first call (LP-10) finds
it whenever the mailbox has room. When it has none (every slot held by calls or promised to other
callers), the link is attached with no credit, and a request sent on it anyway is refused as
LP-10 says: the engine detaches the link with ``amqp:link:transfer-limit-exceeded`` when the
transfer arrives (a transfer beyond credit is never held); the caller may attach again and wait
for credit. Credit is taken back with a drain, never by lowering it, so a transfer that was
already on its way when credit was taken back is still answered.

``RequestLink``/``ReplyLink`` subclass the transport's ``Receiver``/``Sender`` only to receive
the transport's per-link events (message, flow, outcome, detach): the credit and the queueing
are the actor's, not theirs.
"""

from __future__ import annotations

import copy
import itertools
import ssl
import uuid
from collections import deque
from collections.abc import Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import attrs
import structlog
import trio

from framework import net, transport
from framework.actor import Actor
from framework.amqp.errors import INVALID_FIELD, NOT_FOUND, NOT_IMPLEMENTED
from framework.amqp.link import Delivery, Link, LinkState
from framework.amqp.messaging import Error, Message
from framework.amqp.performatives import RCV_FIRST, ROLE_RECEIVER, SND_UNSETTLED
from framework.client import Client
from framework.client import connect as connect_client
from framework.endpoints import Receiver, Sender
from framework.errors import PairlinkError
from framework.linkpair import (
    LINK_PAIR_V1_0,
    PairHalf,
    Refusal,
    judge_attach,
    paired_properties,
)
from framework.wire import ME

if TYPE_CHECKING:
    from framework.client import ServiceProxy
    from framework.service import Hosted

log = structlog.get_logger("pairlink.service")

current_server: ContextVar[Server | None] = ContextVar("pairlink_server", default=None)
"""The server whose handler (or on_start/on_stop) is running: how ``remote()`` finds it."""


class RequestLink(Receiver):
    """A peer's sending link to a service: each message is a call for ``actor``."""

    def __init__(
        self,
        conn: transport.AmqpConnection,
        link: Link,
        actor: Actor,
        peer: Peer,
        half: PairHalf,
    ) -> None:
        super().__init__(conn, link, credit=0)
        self.actor = actor
        self.ledger = actor.mailbox.ledger(conn, link)  # its credit, as the mailbox counts it
        self.peer = peer
        self.half = half
        self.pair: ReplyLink | None = None  # the paired half, once both are attached
        self.gone = False
        self.attached.set()

    @property
    def usable(self) -> bool:
        return not self.gone and self.link.state is LinkState.ATTACHED

    def set_credit(self, credit: int) -> None:
        """Set the link's credit (a flow frame)."""
        if self.usable:
            self.conn.flow(self.link, credit)

    def drain(self, credit: int) -> None:
        """Ask the sender to use its ``credit`` now or give it back (a flow with drain)."""
        if self.usable:
            self.conn.flow(self.link, credit, drain=True)

    def release(self) -> None:
        """A call that came on this link no longer holds its mailbox slot."""
        self.actor.release(self)

    def set_outcome(self, delivery: Delivery, state: Any) -> None:
        """Say the outcome (Accepted, Rejected) of an unsettled request."""
        if self.usable:
            self.conn.settle(delivery, state)

    def route_for(self, message: Message) -> ReplyLink | None:
        """Where the reply to ``message`` goes (LP-8), or None if nowhere."""
        # typed str, but decoded as whatever the peer put there
        reply_to: object = message.properties.reply_to if message.properties else None
        if reply_to == ME:
            pair = self.pair
            return pair if pair is not None and pair.usable else None
        if not isinstance(reply_to, str):  # absent, or a peer's value of another type
            return None
        route = self.peer.routes.get(reply_to)
        return route if route is not None and route.usable else None

    def why_unroutable(self, message: Message) -> tuple[str, str]:
        # typed str, but decoded as whatever the peer put there
        reply_to: object = message.properties.reply_to if message.properties else None
        if reply_to is None:
            return INVALID_FIELD, "the request has no reply-to"
        if not isinstance(reply_to, str):
            return INVALID_FIELD, f"reply-to {reply_to!r} is not an address"
        if reply_to == ME:
            return NOT_FOUND, "reply-to $me, but this link has no attached paired link"
        return NOT_FOUND, f"no link of this connection has the target {reply_to!r}"

    def on_message(self, delivery: Delivery, payload: bytes) -> None:
        self.actor.arrive(self, delivery, payload)

    def on_flow(self) -> None:
        self.actor.mailbox.flowed(self)  # answering a drain, the sender may return credit

    def on_ended(self) -> None:
        if not self.gone:
            self.gone = True
            self.actor.link_gone(self)
            self.peer.forget(self)


class ReplyLink(Sender):
    """A peer's receiving link: replies go out on it as its credit allows."""

    def __init__(
        self,
        conn: transport.AmqpConnection,
        link: Link,
        peer: Peer,
        half: PairHalf,
        to: str | None,
    ) -> None:
        super().__init__(conn, link)
        self.peer = peer
        self.half = half
        self.to = to  # the reply's `to`: "$me" on a pair, else the address routed to
        remote = link.remote_attach
        self.presettle = remote is None or remote.snd_settle_mode != SND_UNSETTLED
        self._parked: deque[tuple[bytes, RequestLink]] = deque()  # and the request's link
        self.gone = False
        self.attached.set()

    @property
    def usable(self) -> bool:
        return not self.gone and self.link.state is LinkState.ATTACHED

    @property
    def parked(self) -> int:
        """Replies waiting for the requester's credit."""
        return len(self._parked)

    def deliver(self, payload: bytes, origin: RequestLink) -> bool:
        """Send a reply to a call that came on ``origin`` now, or park it until credit comes
        (it keeps its mailbox slot until then). False: the link is gone, the reply cannot be
        delivered."""
        if not self.usable:
            return False
        if self.link.usable_credit > 0 and not self._parked:
            self._send_now(payload)
            origin.release()
        else:
            self._parked.append((payload, origin))
        return True

    def _send_now(self, payload: bytes) -> None:
        try:
            self.conn.send(self.link, payload, settled=self.presettle)
        except PairlinkError as exc:  # the link or connection is closing
            log.warning("reply.dropped", link=self.link.name, error=str(exc))

    def on_flow(self) -> None:
        while self._parked and self.link.usable_credit > 0 and self.usable:
            payload, origin = self._parked.popleft()
            self._send_now(payload)
            origin.release()
        if self.link.drain and not self._parked:  # no reply waits: the credit is used up
            self.conn.complete_drain(self.link)

    def on_update(self, delivery: Delivery) -> None:
        # the requester decided but left settling to us (rcv-settle-mode second)
        decided = delivery.remote_state is not None and not delivery.remote_settled
        if decided and self.usable:
            self.conn.settle(delivery, delivery.remote_state)

    def on_ended(self) -> None:
        if self.gone:
            return
        self.gone = True
        if self._parked:
            log.warning("reply.undeliverable", link=self.link.name, dropped=len(self._parked))
        while self._parked:
            _payload, origin = self._parked.popleft()
            origin.release()
        self.peer.forget(self)


Endpoint = RequestLink | ReplyLink


@attrs.define(eq=False)
class Peer:
    """What the container knows about one connection: its links by (name, our role), for
    the pairing rules, and its reply routes by address, for LP-8."""

    conn: transport.AmqpConnection
    halves: dict[tuple[str, bool], Endpoint] = attrs.field(factory=dict)
    routes: dict[str, ReplyLink] = attrs.field(factory=dict)

    def add(self, endpoint: Endpoint) -> None:
        self.halves[(endpoint.link.name, endpoint.link.role)] = endpoint
        if isinstance(endpoint, ReplyLink) and endpoint.to not in (None, ME):
            assert endpoint.to is not None
            self.routes[endpoint.to] = endpoint

    def forget(self, endpoint: Endpoint) -> None:
        key = (endpoint.link.name, endpoint.link.role)
        if self.halves.get(key) is endpoint:
            del self.halves[key]
        if isinstance(endpoint, ReplyLink):
            if endpoint.to is not None and self.routes.get(endpoint.to) is endpoint:
                del self.routes[endpoint.to]
            partner = self.halves.get((endpoint.link.name, ROLE_RECEIVER))
            if isinstance(partner, RequestLink) and partner.pair is endpoint:
                partner.pair = None

    def endpoints(self) -> list[Endpoint]:
        return list(self.halves.values())


class Server:
    """A running service container (see ``framework.service.open_server``)."""

    def __init__(
        self,
        hosted: Sequence[Hosted],
        *,
        url: str,
        users: dict[str, str] | None,
        ssl_context: ssl.SSLContext | None,
        grace: float,
        container_id: str | None,
        call_url: str | None,
        listen_options: dict[str, Any],
    ) -> None:
        self.hosted = list(hosted)
        self.actors: dict[str, Actor] = {}
        for item in self.hosted:
            if item.address in self.actors:
                raise ValueError(f"two services at the address {item.address!r}")
            self.actors[item.address] = Actor(item)
        self.container_id = container_id or f"pairlink-{uuid.uuid4()}"
        self.grace = grace
        self.listener: net.Listener | None = None
        self.peers: dict[transport.AmqpConnection, Peer] = {}
        self.log = log.bind(container=self.container_id)
        self._url = url
        self._users = users
        self._ssl_context = ssl_context
        self._call_url = call_url
        self._listen_options = listen_options
        self._dynamic = itertools.count(1)
        self._stop = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._client: Client | None = None
        self._client_lock = trio.Lock()
        self._client_done = trio.Event()

    @property
    def url(self) -> str:
        """``amqp[s]://host:port`` as listened on (the real port when asked for port 0)."""
        assert self.listener is not None, "the server is not listening yet"
        return self.listener.url

    @property
    def port(self) -> int:
        assert self.listener is not None, "the server is not listening yet"
        return self.listener.port

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
        async with net.listen(
            self._url,
            on_attach=self.on_attach,
            handler=self._track,
            users=self._users,
            ssl_context=self._ssl_context,
            container_id=self.container_id,
            offered_capabilities=[LINK_PAIR_V1_0],  # LP-1: we accept peer-initiated links
            **self._listen_options,
        ) as listener:
            self.listener = listener
            self.log.info("server.listening", url=listener.url, services=list(self.actors))
            # a cancel that came as we finished starting ends it here: once shielded, a
            # started() into a cancelled nursery.start would leave us waiting for a stop()
            await trio.lowlevel.checkpoint_if_cancelled()
            scope.shield = True  # serving: from now on, only stop() ends it, gracefully
            task_status.started()
            await self._stop.wait()
            self.log.info("server.stopping", grace=self.grace)
            await self._drain()
            for peer in list(self.peers.values()):
                for endpoint in peer.endpoints():
                    if endpoint.link.state is LinkState.ATTACHED:
                        peer.conn.detach(endpoint.link)
        # leaving `listen` closed every connection

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

    async def _track(self, conn: transport.AmqpConnection) -> None:
        """Runs for each connection's lifetime (the listener's ``handler``)."""
        self._peer(conn)
        try:
            await conn.closed.wait()
        finally:
            self.peers.pop(conn, None)

    def _peer(self, conn: transport.AmqpConnection) -> Peer:
        peer = self.peers.get(conn)
        if peer is None:
            peer = self.peers[conn] = Peer(conn)
        return peer

    # -- attaches --------------------------------------------------------------------------

    def on_attach(self, conn: transport.AmqpConnection, link: Link) -> None:
        """Answer a link the peer opened (called before any later frame is read, so the
        credit granted here is on the wire before a pipelined request arrives: LP-10)."""
        peer = self._peer(conn)
        remote = link.remote_attach
        assert remote is not None
        half = PairHalf.of(remote)
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
        other: Endpoint | None,
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
        )
        if refusal is not None:
            self._refuse(peer, link, half, refusal)
            return
        assert actor is not None
        peer.conn.answer_attach(
            link,
            target=target,
            properties=paired_properties() if half.paired else None,
            rcv_settle_mode=RCV_FIRST,  # we settle requests ourselves, at once
        )
        endpoint = RequestLink(peer.conn, link, actor, peer, half)
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
        other: Endpoint | None,
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
        peer.conn.answer_attach(
            link, source=source, properties=paired_properties() if half.paired else None
        )
        endpoint = ReplyLink(peer.conn, link, peer, half, to)
        peer.add(endpoint)
        if half.paired and isinstance(other, RequestLink):
            other.pair = endpoint

    def _refuse(self, peer: Peer, link: Link, half: PairHalf, refusal: Refusal) -> None:
        self.log.info(
            "link.refused",
            conn=peer.conn.id,
            name=link.name,
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
        if url is None:
            if self.listener is None or self._stop.is_set():
                raise RuntimeError(
                    "remote() reaches this server's own services only while it serves "
                    "(not from on_start or on_stop): pass call_url to reach another one"
                )
            url = self.listener.url
        async with connect_client(url, reconnect=True) as client:
            task_status.started(client)
            await self._client_done.wait()
