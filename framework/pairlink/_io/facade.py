"""The engine's facade: what the layers above do to a connection, as :class:`EngineFacade`,
the base of :class:`pairlink._io.connection.AmqpConnection`.

Each operation acts on the engine (``flow``, ``send``, ``settle``, ``detach``, ``attach``,
``begin``, ``refuse``, ``answer_attach``, ``pass_through``/``forward``...), has what it queued
sent (:mod:`pairlink._io.writes`) and turns engine refusals into pairlink errors; nothing
outside this class touches the engine for them. It reads the connection's lifecycle, never
changes it: the connection does, as its events come (:mod:`pairlink._io.connection`).
"""

from __future__ import annotations

import itertools
from typing import Unpack

import trio

from pairlink._amqp import errors as conditions
from pairlink._amqp.connection import AnswerFields, AttachFields, Connection
from pairlink._amqp.errors import LocalProtocolError
from pairlink._amqp.events import SessionBegun, SessionEnded
from pairlink._amqp.link import Delivery, Forward, Link, LinkState
from pairlink._amqp.messaging import DeliveryState, Error, Source, Target
from pairlink._amqp.performatives import Open
from pairlink._amqp.session import Session, SessionState
from pairlink._amqp.types import Fields
from pairlink._io.lifecycle import CLOSED, Lifecycle
from pairlink._io.writes import Writes
from pairlink.errors import ConnectionLostError, LinkDetachedError, MessageTooLargeError

_LINK_OPEN = (LinkState.ATTACH_SENT, LinkState.ATTACHED)


class AcceptFields(AnswerFields, total=False):
    """What :meth:`EngineFacade.answer_attach` takes: the termini (by default the peer's,
    mirrored) and the rest of our answering attach."""

    source: Source | None
    target: Target | None


class EngineFacade:
    """Acting on a connection's engine, guarded by the connection's lifecycle."""

    state: Lifecycle
    """Where the connection is (:class:`pairlink._io.connection.AmqpConnection` moves it)."""
    error: ConnectionLostError | None
    """Why the connection failed, or is failing; None while it has not."""

    def __init__(self, engine: Connection, writes: Writes) -> None:
        self._engine = engine
        self._writes = writes
        self._session: Session | None = None
        self._session_waiters: dict[Session, trio.Event] = {}
        self._names = itertools.count(1)

    def raise_if_closed(self) -> None:
        if self.error is not None:
            raise self.error
        if self.state >= CLOSED:
            raise ConnectionLostError("the connection is closed")

    # -- links -----------------------------------------------------------------------------

    def flow(self, link: Link, credit: int, *, drain: bool = False) -> None:
        """As receiver: set the link's credit (absolute). While the peer is not reading what
        we send (``backlogged``), credit increases wait and go out when it drains. ``drain``
        asks the sender to use the credit now or give it back (it goes out at once)."""
        if not self._link_open(link):
            return
        writes = self._writes
        if (
            not drain
            and credit > link.link_credit
            and (writes.backlogged or writes.waiting_bytes() > writes.max_bytes // 4)
        ):
            writes.defer_flow(link, credit - link.link_credit)
            return
        writes.deferred_flows.pop(link, None)
        self._engine.flow(link, credit, drain=drain)
        writes.kick()

    def complete_drain(self, link: Link) -> None:
        """As sender with nothing to send: answer the receiver's drain (Part 2 §2.6.7)."""
        if self._link_open(link):
            self._engine.complete_drain(link)
            self._writes.kick()

    def settle(self, delivery: Delivery, state: DeliveryState | None = None) -> None:
        """Declare the outcome of a delivery we received, and settle it."""
        if not delivery.settled and self._link_open(delivery.link):
            self._engine.settle(delivery, state)
            self._writes.kick()

    def send(
        self,
        link: Link,
        payload: bytes | memoryview,
        *,
        settled: bool | None = None,
        presume_credit: bool = False,
        through: bool = False,
    ) -> Delivery:
        """Send one message on ``link`` (``through``: write it from here if the writer is idle
        and not woken: a lone call). Raises ``MessageTooLargeError`` past the peer's max size,
        ``LinkDetachedError``/``ConnectionLostError`` when the link or connection cannot."""
        self.raise_if_closed()
        try:
            delivery = self._engine.send(
                link, payload, settled=settled, presume_credit=presume_credit
            )
        except LocalProtocolError as exc:
            if exc.condition == conditions.MESSAGE_SIZE_EXCEEDED:
                raise MessageTooLargeError(
                    len(payload), link.remote_max_message_size or 0
                ) from None
            raise LinkDetachedError(
                f"link {link.name!r} cannot send: {exc.description}", exc.condition
            ) from None
        writes = self._writes
        if not (through and not writes.kicked and writes.write_through()):
            writes.kick()
        return delivery

    def pass_through(self, link: Link, forward: Forward) -> None:
        """As receiver: hand each plain pre-settled message on ``link`` to ``forward`` (a
        relay, which sends it on with :meth:`forward`) as its frame is read, with no delivery
        and no event (``Connection.pass_through``); what it declines arrives as usual."""
        self._engine.pass_through(link, forward)

    def forward(self, link: Link, payload: bytes | bytearray | memoryview) -> bool:
        """Send ``payload`` on ``link`` pre-settled, as it came, if it goes at once in one
        frame (``Connection.forward``); False, and nothing done, for anything less plain
        (``send`` then says why)."""
        if not self._engine.forward(link, payload):
            return False
        self._writes.kick()
        return True

    def detach(self, link: Link, *, error: Error | None = None, closed: bool = True) -> None:
        """Detach (by default close) our end of ``link``; nothing if it is already going."""
        if not self._engine.closed:
            self._engine.detach(link, closed=closed, error=error)
            self._writes.kick()

    def answer_attach(
        self,
        link: Link,
        *,
        source: Source | None = None,
        target: Target | None = None,
        **attach: Unpack[AnswerFields],
    ) -> None:
        """Answer a peer's attach with our own (by default mirroring its termini)."""
        self._engine.answer_attach(
            link,
            source=link.remote_source if source is None else source,
            target=link.remote_target if target is None else target,
            **attach,
        )
        self._writes.kick()

    def attach(
        self, *, role: bool, session: Session | None = None, **attach: Unpack[AttachFields]
    ) -> Link:
        """Attach a link of ours (frames go out at once, no waiting): ``name``, ``source``,
        ``target`` and the rest as :meth:`Connection.attach` takes them.
        ``ConnectionLostError`` once either side has sent its close, even before this
        connection's end is noticed (a replica's health check attached into that window)."""
        self.raise_if_closed()
        if self._engine.closed:
            raise ConnectionLostError("the connection is closing")
        link = self._engine.attach(session or self.session, role=role, **attach)
        self._writes.kick()
        return link

    def refuse(
        self,
        link: Link,
        error: Error,
        *,
        null_terminus: bool = True,
        properties: Fields | None = None,
    ) -> None:
        """Refuse a peer's link: a null terminus (the link was never created, §2.6.3), or
        an attach mirroring the peer's with ``properties`` (it was created, then found
        wanting); either way followed by a closing detach carrying ``error``."""
        if null_terminus:
            self._engine.refuse_attach(link, error)
            self._writes.kick()
        else:
            self.answer_attach(link, properties=properties)
            self.detach(link, error=error)

    def link_name(self, prefix: str) -> str:
        return f"{prefix}-{self._engine.config.container_id}-{next(self._names)}"

    def _link_open(self, link: Link) -> bool:
        return not self._engine.closed and link.state in _LINK_OPEN

    # -- sessions --------------------------------------------------------------------------

    @property
    def session(self) -> Session:
        """The connection's default session, begun on first use (pipelined, no wait)."""
        if self._session is None:
            self.raise_if_closed()
            self._session = self._engine.begin()
            self._writes.kick()
        return self._session

    def begin(self) -> Session | None:
        """Begin one more session (pipelined, no wait), for links past what one session's
        handles hold; None when the channel-max of either end allows no more here."""
        self.raise_if_closed()
        try:
            session = self._engine.begin()
        except LocalProtocolError as exc:
            if exc.condition != conditions.RESOURCE_LIMIT_EXCEEDED:  # closing: no new session
                raise ConnectionLostError(f"cannot begin a session: {exc.description}") from None
            return None
        self._writes.kick()
        return session

    async def wait_begun(self, session: Session) -> None:
        """Wait for the peer's begin answering ``session``. A pipelined transfer must not
        reach a session the peer has not set up yet: Proton, whose application begins a
        session only after reading the whole burst, closes the connection with
        window-violation. ``ConnectionLostError`` if the connection or the session ends."""
        while session.state is SessionState.BEGIN_SENT:
            self.raise_if_closed()
            waiter = self._session_waiters.get(session)
            if waiter is None:
                waiter = self._session_waiters[session] = trio.Event()
            await waiter.wait()
        self.raise_if_closed()
        if session.state is not SessionState.MAPPED:
            raise ConnectionLostError("the peer ended the session")

    def _on_session_begun(self, event: SessionBegun | SessionEnded) -> None:
        """Wake ``wait_begun``: it reads from the session's state whether it began or ended."""
        waiter = self._session_waiters.pop(event.session, None)
        if waiter is not None:
            waiter.set()

    def _on_session_ended(self, event: SessionEnded) -> None:
        if event.session is self._session:
            self._session = None
        self._on_session_begun(event)

    def _wake_session_waiters(self) -> None:
        """The connection is over: ``wait_begun`` raises."""
        for waiter in self._session_waiters.values():
            waiter.set()
        self._session_waiters.clear()

    # -- what the peer said ----------------------------------------------------------------

    @property
    def remote_open(self) -> Open | None:
        """The peer's open performative (its container-id...), once it came."""
        return self._engine.remote_open

    @property
    def remote_offered_capabilities(self) -> list[str]:
        return self._engine.remote_offered_capabilities

    @property
    def sasl_identity(self) -> str | None:
        """Who the peer authenticated as (SASL PLAIN user, EXTERNAL identity), if anyone."""
        return self._engine.sasl_identity
