"""Our ends of AMQP links in the Trio layer, and the one way to own one.

Every link we hold is a :class:`LinkEnd` (defined beside the connection's dispatch, in
:mod:`pairlink._io.connection`, and exported here): the connection's reader calls its *owner*
with each of the engine's events for that link, straight from its dispatch. An owner is any
object with the :class:`LinkOwner` methods it cares about (the service container's request and
reply links, the client's pairs, the gateway's relays). Owners compose ends; nothing subclasses
them. Whether a link can still be used is decided by the end alone (:attr:`LinkEnd.usable`).

Two ready-made owners serve code that wants a plain API: :class:`Sender` (send, waiting for
credit in turn and for the outcome) and :class:`Receiver` (a queue bounded by the credit it
grants). :func:`attach` opens a link of ours for an owner, :func:`accept` answers a peer's;
``open_sender``, ``open_receiver``, ``accept_sender`` and ``accept_receiver`` build the
ready-made owners on them. Hooks run in the reader task: they must not block.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator
from typing import Protocol, Unpack

import attrs
import trio

from pairlink._amqp import errors as conditions
from pairlink._amqp.connection import AttachFields
from pairlink._amqp.errors import DecodeError
from pairlink._amqp.link import Delivery, Link
from pairlink._amqp.messaging import DeliveryState, Error, Message, Rejected, Source, Target
from pairlink._amqp.performatives import RCV_FIRST, ROLE_RECEIVER, ROLE_SENDER, SND_MIXED
from pairlink._amqp.session import Session
from pairlink._amqp.types import Fields
from pairlink._io.connection import AmqpConnection
from pairlink._io.connection import LinkEnd as LinkEnd
from pairlink._io.connection import LinkOwner as LinkOwner
from pairlink._io.facade import AcceptFields
from pairlink.errors import ConnectionLostError, LinkDetachedError, PairlinkError


def attach(
    conn: AmqpConnection,
    owner: LinkOwner,
    *,
    role: bool,
    session: Session | None = None,
    **fields: Unpack[AttachFields],
) -> LinkEnd:
    """Attach a link of ours for ``owner`` (frames go out at once, no waiting): ``name``,
    ``source``, ``target`` and the rest as :meth:`pairlink._amqp.connection.Connection.attach`
    takes them."""
    return LinkEnd(conn, conn.attach(role=role, session=session, **fields), owner)


def accept(
    conn: AmqpConnection, link: Link, owner: LinkOwner, **fields: Unpack[AcceptFields]
) -> LinkEnd:
    """Answer a peer's attach for ``owner`` (by default mirroring its termini)."""
    conn.answer_attach(link, **fields)
    end = LinkEnd(conn, link, owner)
    end.attached.set()
    return end


class _Ready(LinkOwner):
    """What :class:`Sender` and :class:`Receiver` share: the end they own, and an optional
    ``watcher`` that hears each event after them."""

    def __init__(self, watcher: LinkOwner | None) -> None:
        self.watcher = watcher
        self.end: LinkEnd

    @property
    def link(self) -> Link:
        return self.end.link

    @property
    def attached(self) -> trio.Event:
        return self.end.attached

    @property
    def detached(self) -> LinkDetachedError | None:
        return self.end.detached

    def detach(self, error: Error | None = None) -> None:
        self.end.detach(error)

    def link_attached(self, end: LinkEnd) -> None:
        if self.watcher is not None:
            self.watcher.link_attached(end)


class Pending(Protocol):
    """A pre-settled message waiting in a :class:`Sender`'s line instead of a task: it goes out
    from the reader task when its turn and credit come (:meth:`Sender.send_or_queue`)."""

    payload: bytes

    def sent(self, error: PairlinkError | None) -> None:
        """It went out (``error`` None), or ``error`` says why it never will."""


class Sender(_Ready):
    """Sends on one link. Tasks waiting for credit queue in arrival order and each flow wakes
    only as many as it brings credit for: with many callers and a slow peer, a flow frame does
    not wake every waiter to send all but one back to sleep. A pre-settled message may wait in
    the same line with no task at all (:meth:`send_or_queue`)."""

    def __init__(self, watcher: LinkOwner | None = None) -> None:
        super().__init__(watcher)
        self._outcomes: dict[Delivery, trio.Event] = {}
        self._turns: deque[trio.Event | Pending] = deque()
        self._woken = 0  # waiters woken for credit that have not sent yet

    @property
    def waiting(self) -> int:
        """Tasks and messages waiting for credit, or tasks woken for it and not sent yet."""
        return len(self._turns) + self._woken

    def has_credit(self, presume_credit: bool = False) -> bool:
        """Whether ``send`` would find its credit at once, without waiting."""
        link = self.end.link
        if presume_credit and link.remote_attach is None:
            return True
        return not self._turns and link.usable_credit > self._woken

    async def take_credit(self) -> None:
        """Wait, first come first served, until one unit of credit is ours."""
        self.end.check_usable()
        if self.has_credit():
            return
        turn = trio.Event()
        self._turns.append(turn)
        try:
            await turn.wait()
        except BaseException:  # cancelled or timed out
            if turn.is_set():  # woken but leaving: the credit goes to the next in line
                self._woken -= 1
                self._hand_out()
            else:
                self._turns.remove(turn)
            raise
        self._woken -= 1
        self.end.check_usable()

    def _hand_out(self) -> None:
        free = self.end.link.usable_credit - self._woken
        while free > 0 and self._turns:
            turn = self._turns.popleft()
            if isinstance(turn, trio.Event):
                turn.set()
                self._woken += 1
                free -= 1
            elif self._send_pending(turn):
                free -= 1

    def send_or_queue(
        self, pending: Pending, *, presume_credit: bool = False, through: bool = False
    ) -> bool:
        """Send ``pending.payload`` (the link's settle mode: pre-settled) now if its credit is
        there (True), else put it in line (False) and return at once: it goes out when its
        turn comes, and ``pending.sent`` is told then. No task waits for credit, so a caller
        that waits for an answer anyway waits once, not twice. Raises as ``send`` does when
        it goes at once; ``withdraw`` takes it out of line.

        ``through``: nothing else is likely to be sent soon (a caller with one call in flight),
        so the connection writes it to the socket from here if its writer is idle, as its
        reader writes answers: no wake-up of the writer task, whose two run-loop passes cost a
        sequential call more than the write itself. Under load the writer is busy or already
        woken, and the bytes of many callers still go out in one write."""
        end = self.end
        end.check_usable()
        if not self.has_credit(presume_credit):
            self._turns.append(pending)
            return False
        end.conn.send(end.link, pending.payload, presume_credit=presume_credit, through=through)
        if end.link.drain:
            self._answer_drain()
        return True

    def withdraw(self, pending: Pending) -> None:
        """Take ``pending`` out of line (its caller gave up), if it is still in it."""
        with contextlib.suppress(ValueError):
            self._turns.remove(pending)

    def _send_pending(self, pending: Pending) -> bool:
        """Send a message whose turn came; False if it could not go (it took no credit)."""
        end = self.end
        try:
            end.check_usable()
            end.conn.send(end.link, pending.payload)
        except PairlinkError as exc:
            pending.sent(exc)
            return False
        pending.sent(None)
        return True

    def _ending_error(self) -> PairlinkError:
        try:
            self.end.check_usable()
        except PairlinkError as exc:
            return exc
        return LinkDetachedError(f"link {self.end.link.name!r} is gone")

    async def send(
        self,
        message: Message | bytes,
        *,
        settled: bool | None = None,
        wait: bool = True,
        presume_credit: bool = False,
    ) -> Delivery:
        """Send one message; unless it goes ``settled``, ``wait`` for the receiver's outcome.

        ``presume_credit`` sends before the peer's attach has granted any (LP-10). Returns the
        delivery, whose ``remote_state`` holds the outcome once it came.
        """
        end = self.end
        payload = message.encode() if isinstance(message, Message) else message
        if not (presume_credit and end.link.remote_attach is None):
            await self.take_credit()
        end.check_usable()
        delivery = end.conn.send(end.link, payload, settled=settled, presume_credit=presume_credit)
        if end.link.drain:
            self._answer_drain()
        if delivery.settled or not wait:
            return delivery
        done = self._outcomes[delivery] = trio.Event()
        try:
            await done.wait()
        finally:
            self._outcomes.pop(delivery, None)
        if not delivery.remote_settled and delivery.remote_state is None:
            end.check_usable()
        return delivery

    def _answer_drain(self) -> None:
        """The receiver is draining and nobody waits to send: give the credit back."""
        if self.end.link.drain and not self._turns and not self._woken:
            self.end.conn.complete_drain(self.end.link)

    def link_flowed(self, end: LinkEnd) -> None:
        self._hand_out()
        self._answer_drain()
        if self.watcher is not None:
            self.watcher.link_flowed(end)

    def link_updated(self, end: LinkEnd, delivery: Delivery) -> None:
        if delivery.remote_settled or delivery.remote_state is not None:
            event = self._outcomes.get(delivery)
            if event is not None:
                event.set()
        if delivery.remote_settled:  # one unsettled less: room under max-unsettled
            self._hand_out()
        if self.watcher is not None:
            self.watcher.link_updated(end, delivery)

    def link_ended(self, end: LinkEnd) -> None:
        while self._turns:
            turn = self._turns.popleft()
            if isinstance(turn, trio.Event):
                turn.set()
                self._woken += 1
            else:
                turn.sent(self._ending_error())
        for event in self._outcomes.values():
            event.set()
        if self.watcher is not None:
            self.watcher.link_ended(end)


@attrs.define
class Received:
    """A message that arrived on a receiver, with the delivery to settle."""

    message: Message
    delivery: Delivery
    payload: bytes


class Receiver(_Ready):
    """Receives on one link, holding ``credit`` messages at most (a bounded mailbox).

    Credit is granted again as the consumer takes messages, once half of it is used, so one
    flow frame answers many messages and nothing ever queues beyond ``credit``.
    """

    def __init__(self, credit: int, watcher: LinkOwner | None = None) -> None:
        super().__init__(watcher)
        self.credit = credit
        # unbounded in type only: the peer cannot send past the credit we granted
        self._send, self._recv = trio.open_memory_channel[Received](math.inf)
        self._queued = 0

    def grant(self) -> None:
        """Top the link's credit up to ``credit`` minus what waits unconsumed."""
        if self.end.detached is None:
            self.end.conn.flow(self.end.link, self.credit - self._queued)

    async def receive(self) -> Received:
        try:
            item = await self._recv.receive()
        except trio.EndOfChannel:
            self.end.check_usable()
            raise LinkDetachedError(f"link {self.end.link.name!r} is gone") from None
        self._queued -= 1
        if self.end.link.link_credit + self._queued <= self.credit // 2:
            self.grant()
        return item

    def settle(self, received: Received, state: DeliveryState) -> None:
        """Declare the outcome (Accepted(), Rejected(...)...) of a received message."""
        self.end.conn.settle(received.delivery, state)

    def link_flowed(self, end: LinkEnd) -> None:
        if self.watcher is not None:
            self.watcher.link_flowed(end)

    def link_received(self, end: LinkEnd, delivery: Delivery, payload: bytes) -> None:
        try:
            message = Message.decode(payload)
        except DecodeError as exc:  # refuse it, keep the link: the next one may be fine
            end.conn.settle(
                delivery,
                Rejected(error=Error(condition=conditions.DECODE_ERROR, description=str(exc))),
            )
            end.conn.log.warning("message.undecodable", link=end.link.name, error=str(exc))
            if end.link.link_credit + self._queued <= self.credit // 2:
                self.grant()
            return
        self._queued += 1
        self._send.send_nowait(Received(message, delivery, payload))
        if self.watcher is not None:
            self.watcher.link_received(end, delivery, payload)

    def link_ended(self, end: LinkEnd) -> None:
        self._send.close()
        if self.watcher is not None:
            self.watcher.link_ended(end)

    def __aiter__(self) -> AsyncIterator[Received]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Received]:
        while True:
            try:
                yield await self.receive()
            except (ConnectionLostError, LinkDetachedError):
                return


def open_sender(
    conn: AmqpConnection,
    address: str | None,
    *,
    name: str | None = None,
    source_address: str | None = None,
    properties: Fields | None = None,
    snd_settle_mode: int = SND_MIXED,
    rcv_settle_mode: int = RCV_FIRST,
    session: Session | None = None,
    watcher: LinkOwner | None = None,
) -> Sender:
    """Attach a sending link to ``address``; frames go out at once, no waiting."""
    sender = Sender(watcher)
    sender.end = attach(
        conn,
        sender,
        session=session,
        name=name or conn.link_name("sender"),
        role=ROLE_SENDER,
        source=Source(address=source_address),
        target=Target(address=address),
        snd_settle_mode=snd_settle_mode,
        rcv_settle_mode=rcv_settle_mode,
        properties=properties,
    )
    return sender


def open_receiver(
    conn: AmqpConnection,
    address: str | None,
    *,
    credit: int = 100,
    name: str | None = None,
    target_address: str | None = None,
    dynamic: bool = False,
    properties: Fields | None = None,
    rcv_settle_mode: int = RCV_FIRST,
    session: Session | None = None,
    watcher: LinkOwner | None = None,
) -> Receiver:
    """Attach a receiving link from ``address`` and grant it ``credit`` at once."""
    receiver = Receiver(credit, watcher)
    receiver.end = attach(
        conn,
        receiver,
        session=session,
        name=name or conn.link_name("receiver"),
        role=ROLE_RECEIVER,
        source=Source(address=address, dynamic=dynamic),
        target=Target(address=target_address),
        rcv_settle_mode=rcv_settle_mode,
        properties=properties,
    )
    receiver.grant()
    return receiver


def accept_receiver(
    conn: AmqpConnection,
    link: Link,
    *,
    credit: int = 100,
    watcher: LinkOwner | None = None,
    **fields: Unpack[AcceptFields],
) -> Receiver:
    """Answer a peer's sending link: we receive on it, holding ``credit`` at most."""
    receiver = Receiver(credit, watcher)
    receiver.end = accept(conn, link, receiver, **fields)
    receiver.grant()
    return receiver


def accept_sender(
    conn: AmqpConnection,
    link: Link,
    *,
    watcher: LinkOwner | None = None,
    **fields: Unpack[AcceptFields],
) -> Sender:
    """Answer a peer's receiving link: we send on it as its credit allows."""
    sender = Sender(watcher)
    sender.end = accept(conn, link, sender, **fields)
    return sender
