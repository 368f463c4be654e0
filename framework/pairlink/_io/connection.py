"""A live AMQP connection in the Trio layer: :class:`AmqpConnection`.

The layers above act on it through the engine's facade it is built on
(:class:`pairlink._io.facade.EngineFacade`: ``flow``, ``send``, ``settle``, ``attach``...);
nothing else touches its engine. Here it keeps its lifecycle (one
:class:`~pairlink._io.lifecycle.Lifecycle` value) and acts on what the engine says
(``dispatch``): on connection events itself, on link events by calling the owner of the link
straight (a :class:`LinkOwner`, through the :class:`LinkEnd` that is the link's ``user_data``;
:mod:`pairlink._io.links`, the link API, is built on both).
An exception in handling its input closes it alone (``amqp:internal-error``).

Each connection runs three tasks in its own nursery: the reader and the timer
(:mod:`pairlink._io.inputs`) and the writer (:mod:`pairlink._io.writes`, which also keeps the
bound on bytes a peer does not read). Leaving the ``connect``/``listen`` context, cleanly or by
cancellation, closes the connection and the socket and leaves no task behind. Network failures
never escape a background task: they fail the operations waiting on that connection with
``ConnectionLostError``. :mod:`pairlink._io.net` makes connections (URLs, connect, listen, TLS).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Protocol

import trio

from pairlink._amqp import errors as conditions
from pairlink._amqp.connection import Connection, ConnectionConfig
from pairlink._amqp.events import (
    ConnectionClosed,
    ConnectionOpened,
    DeliveryUpdated,
    Event,
    LinkAttached,
    LinkAttachRequested,
    LinkDetached,
    LinkFlow,
    MessageReceived,
    ProtocolViolation,
    SaslDone,
    SessionBegun,
    SessionEnded,
    TransportFailed,
)
from pairlink._amqp.link import Delivery, Link, LinkState
from pairlink._amqp.messaging import Error
from pairlink._io.facade import EngineFacade
from pairlink._io.inputs import Inputs
from pairlink._io.lifecycle import ABANDONED, CLOSED, OPEN, OPENING, Lifecycle
from pairlink._io.writes import MAX_OUTGOING_BYTES, Writes
from pairlink._telemetry.logs import get_logger, new_ref
from pairlink.errors import (
    AuthenticationError,
    ConnectionLostError,
    LinkDetachedError,
    PairlinkError,
)

log = get_logger("pairlink.transport")

_conn_ids = itertools.count(1)


OnAttach = Callable[["AmqpConnection", Link], None]
"""Called for each link the peer opens; must answer it (``pairlink._io.links.accept``) or
``refuse`` it."""


class AmqpConnection(EngineFacade):
    """A live AMQP connection over a Trio stream; create it with ``connect`` or ``listen``."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        config: ConnectionConfig,
        *,
        initiator: bool,
        peer: str,
        on_attach: OnAttach | None = None,
        max_outgoing_bytes: int = MAX_OUTGOING_BYTES,
    ) -> None:
        engine = Connection(config, initiator=initiator)
        writes = Writes(self, engine, stream, max_outgoing_bytes)
        super().__init__(engine, writes)
        self.stream = stream
        self.peer = peer
        self.on_attach = on_attach
        self.id = next(_conn_ids)
        self.log = log.bind(conn=self.id, peer=peer, container=config.container_id)
        self.state: Lifecycle = OPENING
        self.error: ConnectionLostError | None = None
        self.opened = trio.Event()  # the peer's open came (whatever the state is now)
        self.closed = trio.Event()  # the state is CLOSED or ABANDONED
        self.flushed = writes.flushed  # the writer is done: last bytes sent, socket closed
        self._inputs = Inputs(self, engine, stream, writes)

    def start(self, nursery: trio.Nursery) -> None:
        """Run the reader, the timer and the writer in ``nursery``; the initiator opens."""
        self._inputs.start(nursery)
        self._writes.start(nursery)
        if self._engine.initiator:
            self._engine.open()
            self._writes.kick()

    async def wait_opened(self) -> None:
        """Wait for the peer's open (SASL done); raises if the connection failed first."""
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def watch_close() -> None:
                    await self.closed.wait()
                    scope.cancel()

                nursery.start_soon(watch_close)
                await self.opened.wait()
                nursery.cancel_scope.cancel()
        self.raise_if_closed()

    def hold_input(self) -> Callable[[], None]:
        """From ``on_attach``: read none of the peer's later frames until the returned
        ``release`` is called, so an attach can be answered after a round trip elsewhere (a
        gateway pairs upstream first) and still be answered, with its credit, before a
        pipelined transfer on it is read (LP-10). Hold it briefly: nothing else on this
        connection is read meanwhile."""
        return self._inputs.hold()

    # -- the end ---------------------------------------------------------------------------

    async def close(self, error: Error | None = None, *, grace: float = 5.0) -> None:
        """Close cleanly: send close, wait ``grace`` seconds at most for the peer's, then
        drop the socket."""
        if self.state < CLOSED:
            self._engine.close(error)
            self._writes.kick()
            with trio.move_on_after(grace):
                await self.closed.wait()
        self.finish(None)

    def abort(self, error: ConnectionLostError) -> None:
        """Give up on the connection at once: nothing more is read, what is queued is sent,
        and the socket closes (a peer that never finished its handshake, for one)."""
        self.finish(error, abandoned=True)

    def finish(self, error: ConnectionLostError | None, *, abandoned: bool = False) -> None:
        """The connection is over (``error``: why, if it failed; ``abandoned``: ignore the
        rest of its input). Wakes everything waiting on it and ends every link, once; an
        ended connection may still be abandoned."""
        if self.state >= CLOSED:
            if abandoned:
                self.state = ABANDONED
            return
        self.state = ABANDONED if abandoned else CLOSED
        if error is not None:
            self.error = error
            self.log.info("connection.failed", error=str(error))
        else:
            self.log.info("connection.closed")
        self.closed.set()
        self._inputs.stop()
        self._writes.stop()
        self._wake_session_waiters()
        for session in list(self._engine.sessions.values()):
            for link in list(session.links.values()):
                end: LinkEnd | None = link.user_data
                if end is not None:
                    try:
                        _end_link(end)
                    except Exception as exc:  # the connection is over: log it, wake the rest
                        self.log.error("link.end_failed", link=link.name, exc_info=exc)

    def abandon(self, exc: Exception) -> None:
        """Backstop: an exception escaped our handling of this connection's input (engine,
        container, actor, gateway or client code). Close this connection alone with
        ``amqp:internal-error``, log the traceback under a reference the peer is told, and
        ignore the rest of its input; the listener and every other connection go on."""
        if self.state is ABANDONED:
            return
        ref = new_ref()
        self.log.error("connection.internal_error", ref=ref, exc_info=exc)
        error = Error(conditions.INTERNAL_ERROR, f"internal error (ref {ref})")
        try:
            if not self._engine.closed:
                self._engine.close(error)
        except Exception as close_exc:  # the engine is past saying anything: just hang up
            self.log.error("connection.close_failed", ref=ref, exc_info=close_exc)
        lost = ConnectionLostError(f"internal error (ref {ref})", conditions.INTERNAL_ERROR)
        self.finish(lost, abandoned=True)

    # -- events ----------------------------------------------------------------------------

    def dispatch(self, events: list[Event], lost: str | None = None) -> None:
        """Act on what the engine said (``_HANDLERS``); ``lost``: the transport is gone."""
        try:
            for event in events:
                handler = _HANDLERS.get(type(event))
                if handler is not None:
                    handler(self, event)
        except Exception as exc:
            self.abandon(exc)
        if lost is not None:
            self.finish(self.error or ConnectionLostError(lost))

    def _on_sasl(self, event: SaslDone) -> None:
        if event.outcome != 0:
            self.error = AuthenticationError(
                f"SASL {event.mechanism} refused (code {event.outcome})", "amqp:unauthorized-access"
            )
            if not self._engine.initiator:  # a refused login: who tried, from where (peer)
                self.log.warning("sasl.refused", mechanism=event.mechanism, user=event.identity)
        else:
            self.log.debug("sasl.done", mechanism=event.mechanism, identity=event.identity)

    def _on_opened(self, _event: ConnectionOpened) -> None:
        if self.state is OPENING:
            self.state = OPEN
        self.opened.set()
        self._inputs.wake_timer()  # the peer's idle-time-out may add a heartbeat deadline
        self.log.debug("connection.opened", remote=self._engine.remote_open)

    def _on_closed(self, event: ConnectionClosed) -> None:
        self._writes.close_answered = not event.by_peer
        error = None
        if event.error is not None:
            error = ConnectionLostError.from_amqp(event.error, "the peer closed the connection")
        self.finish(error)

    def _on_violation(self, event: ProtocolViolation) -> None:
        if event.cause is not None:  # our own engine's fault, not the peer's
            self.log.error("connection.internal_error", why=event.description, exc_info=event.cause)
        else:
            self.log.warning("protocol.violation", condition=event.condition, why=event.description)
        self.error = ConnectionLostError(event.description, event.condition)

    def _on_transport_failed(self, event: TransportFailed) -> None:
        self.finish(self.error or ConnectionLostError(event.reason))

    def _on_attach_requested(self, event: LinkAttachRequested) -> None:
        link = event.link
        self.log.debug("link.requested", link=link.name, role=link.role)
        if self.on_attach is None:
            self.refuse(link, Error(conditions.NOT_ALLOWED, "this container accepts no links"))
        else:
            self.on_attach(self, link)
        self._writes.kick()


# -- link ends, and their events from the dispatch table straight to their owners ----------


class LinkOwner(Protocol):
    """What owns link ends: told of every event on them, in the connection's reader task,
    straight from its dispatch (:mod:`pairlink._io.links` builds owners on this).

    Subclass it to inherit the do-nothing defaults of the hooks an owner does not need (they
    return None explicitly, which keeps them from being abstract).
    """

    def link_attached(self, end: LinkEnd) -> None:
        """The peer answered our attach (``end.attached`` is set already)."""
        return None

    def link_flowed(self, end: LinkEnd) -> None:
        """The link's flow state changed (new credit, a drain)."""
        return None

    def link_received(self, end: LinkEnd, delivery: Delivery, payload: bytes) -> None:
        """A whole message arrived on the link."""
        return None

    def link_updated(self, end: LinkEnd, delivery: Delivery) -> None:
        """The peer changed the state or settlement of one of our deliveries."""
        return None

    def link_ended(self, end: LinkEnd) -> None:
        """The link is over (detached, its session ended, or the connection is gone); called
        once. ``end.detached`` says why when it was detached."""
        return None


class LinkEnd:
    """Our end of one link on ``conn``, its events going to ``owner``: the link's
    ``user_data``, which the dispatch below reads (a link no owner took has none, and hears
    nothing). Whether a link can still be used is decided here alone (:attr:`usable`)."""

    __slots__ = ("attached", "conn", "detached", "ended", "link", "owner")

    def __init__(self, conn: AmqpConnection, link: Link, owner: LinkOwner) -> None:
        self.conn = conn
        self.link = link
        self.owner = owner
        self.attached = trio.Event()  # the peer's attach came, or the link ended first
        self.detached: LinkDetachedError | None = None
        self.ended = False
        link.user_data = self

    @property
    def usable(self) -> bool:
        """Attached both ways and not ended: frames for it may go out."""
        return not self.ended and self.link.state is LinkState.ATTACHED

    def check_usable(self) -> None:
        """Raise why the link cannot carry anything more, if it cannot."""
        self.conn.raise_if_closed()
        if self.detached is not None:
            raise self.detached

    def detach(self, error: Error | None = None) -> None:
        """Detach the link, closing it (with ``error`` if given), unless it is over."""
        self.conn.detach(self.link, error=error)

    def ending_error(self) -> Error | None:
        """The error this end went with: its detach's, else (it went with its session or
        connection) the connection's; None for a plain ending."""
        source: PairlinkError | None = self.detached
        if source is None or source.condition is None:
            source = self.conn.error
        if source is None or source.condition is None:
            return None
        return Error(condition=source.condition, description=source.description)


def _link_attached(_conn: AmqpConnection, event: LinkAttached) -> None:
    end: LinkEnd | None = event.link.user_data
    if end is not None:
        end.attached.set()
        end.owner.link_attached(end)


def _link_flowed(_conn: AmqpConnection, event: LinkFlow) -> None:
    end: LinkEnd | None = event.link.user_data
    if end is not None:
        end.owner.link_flowed(end)


def _message_received(_conn: AmqpConnection, event: MessageReceived) -> None:
    end: LinkEnd | None = event.link.user_data
    if end is not None:
        end.owner.link_received(end, event.delivery, event.payload)


def _delivery_updated(_conn: AmqpConnection, event: DeliveryUpdated) -> None:
    end: LinkEnd | None = event.link.user_data
    if end is not None:
        end.owner.link_updated(end, event.delivery)


def _link_detached(_conn: AmqpConnection, event: LinkDetached) -> None:
    end: LinkEnd | None = event.link.user_data
    if end is not None:
        if end.detached is None:
            end.detached = LinkDetachedError.from_amqp(
                event.error, f"link {event.link.name!r} detached"
            )
        _end_link(end)


def _end_link(end: LinkEnd) -> None:
    """The link is over (detached, or gone with its session or connection): its owner is
    told once."""
    end.attached.set()
    if not end.ended:
        end.ended = True
        end.owner.link_ended(end)


_HANDLERS: dict[type, Callable[[AmqpConnection, Any], None]] = {
    SaslDone: AmqpConnection._on_sasl,
    ConnectionOpened: AmqpConnection._on_opened,
    ConnectionClosed: AmqpConnection._on_closed,
    ProtocolViolation: AmqpConnection._on_violation,
    TransportFailed: AmqpConnection._on_transport_failed,
    LinkAttachRequested: AmqpConnection._on_attach_requested,
    LinkAttached: _link_attached,
    LinkFlow: _link_flowed,
    MessageReceived: _message_received,
    DeliveryUpdated: _delivery_updated,
    LinkDetached: _link_detached,
    SessionBegun: AmqpConnection._on_session_begun,
    SessionEnded: AmqpConnection._on_session_ended,
}
