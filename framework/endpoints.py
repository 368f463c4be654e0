"""Our ends of AMQP links in the Trio layer: senders that wait for credit, receivers that
hold at most their credit.

The connection's reader task calls the public ``on_*`` hooks as the engine reports link events;
layers above (the client's pairs, the service container's request and reply links) subclass
these classes and override the hooks, always calling ``super()`` unless they take the hook's
whole job. Hooks run in the reader task: they must not block.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import attrs
import trio

from framework.amqp import errors as conditions
from framework.amqp.errors import DecodeError
from framework.amqp.link import Delivery, Link
from framework.amqp.messaging import Error, Message, Rejected
from framework.errors import ConnectionLostError, LinkDetachedError

if TYPE_CHECKING:
    from framework.transport import AmqpConnection


class Endpoint:
    """State both kinds of endpoint share: the link, attach and detach, the hooks."""

    def __init__(self, conn: AmqpConnection, link: Link) -> None:
        self.conn = conn
        self.link = link
        self.attached = trio.Event()
        self.detached: LinkDetachedError | None = None
        self._ended = False
        link.user_data = self

    def on_attached(self) -> None:
        """The peer answered our attach (``attached`` is set already)."""

    def on_flow(self) -> None:
        """The link's flow state changed (new credit, drain)."""

    def on_update(self, delivery: Delivery) -> None:
        """The peer changed the state or settlement of one of our deliveries."""

    def on_message(self, delivery: Delivery, payload: bytes) -> None:
        """A whole message arrived on the link."""

    def on_ended(self) -> None:
        """The link is over (detached, its session ended, or the connection is gone): wake
        whatever waits on it. Called once."""

    def link_ended(self, detached: LinkDetachedError | None = None) -> None:
        """Called by the connection: the link ended, with ``detached`` if it was detached."""
        if detached is not None and self.detached is None:
            self.detached = detached
        self.attached.set()
        if not self._ended:
            self._ended = True
            self.on_ended()

    def check_usable(self) -> None:
        self.conn.raise_if_closed()
        if self.detached is not None:
            raise self.detached

    def close(self, error: Error | None = None) -> None:
        """Detach the link, closing it (with ``error`` if given)."""
        self.conn.detach(self.link, error=error)


class Sender(Endpoint):
    """Our sending end of a link. Tasks waiting for credit queue in arrival order and each
    flow wakes only as many as it brings credit for: with many callers and a slow peer, a
    flow frame does not wake every waiter to send all but one back to sleep."""

    def __init__(self, conn: AmqpConnection, link: Link) -> None:
        super().__init__(conn, link)
        self._outcomes: dict[Delivery, trio.Event] = {}
        self._turns: deque[trio.Event] = deque()
        self._woken = 0  # waiters woken for credit that have not sent yet

    def has_credit(self, presume_credit: bool = False) -> bool:
        """Whether ``send`` would find its credit at once, without waiting."""
        if presume_credit and self.link.remote_attach is None:
            return True
        return not self._turns and self.link.usable_credit > self._woken

    async def take_credit(self) -> None:
        """Wait, first come first served, until one unit of credit is ours."""
        self.check_usable()
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
        self.check_usable()

    def _hand_out(self) -> None:
        free = self.link.usable_credit - self._woken
        while free > 0 and self._turns:
            self._turns.popleft().set()
            self._woken += 1
            free -= 1

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
        payload = message.encode() if isinstance(message, Message) else message
        if not (presume_credit and self.link.remote_attach is None):
            await self.take_credit()
        self.check_usable()
        delivery = self.conn.send(
            self.link, payload, settled=settled, presume_credit=presume_credit
        )
        if self.link.drain:
            self._answer_drain()
        if delivery.settled or not wait:
            return delivery
        done = self._outcomes[delivery] = trio.Event()
        try:
            await done.wait()
        finally:
            self._outcomes.pop(delivery, None)
        if not delivery.remote_settled and delivery.remote_state is None:
            self.check_usable()
        return delivery

    def on_flow(self) -> None:
        self._hand_out()
        self._answer_drain()

    def _answer_drain(self) -> None:
        """The receiver is draining and nobody waits to send: give the credit back."""
        if self.link.drain and not self._turns and not self._woken:
            self.conn.complete_drain(self.link)

    def on_update(self, delivery: Delivery) -> None:
        if delivery.remote_settled or delivery.remote_state is not None:
            event = self._outcomes.get(delivery)
            if event is not None:
                event.set()
        if delivery.remote_settled:  # one unsettled less: room under max-unsettled
            self._hand_out()

    def on_ended(self) -> None:
        while self._turns:
            self._turns.popleft().set()
            self._woken += 1
        for event in self._outcomes.values():
            event.set()


@attrs.define
class Received:
    """A message that arrived on a receiver, with the delivery to settle."""

    message: Message
    delivery: Delivery
    payload: bytes


class Receiver(Endpoint):
    """Our receiving end of a link, holding ``credit`` messages at most (a bounded mailbox).

    Credit is granted again as the consumer takes messages, once half of it is used, so one
    flow frame answers many messages and nothing ever queues beyond ``credit``.
    """

    def __init__(self, conn: AmqpConnection, link: Link, credit: int) -> None:
        super().__init__(conn, link)
        self.credit = credit
        # unbounded in type only: the peer cannot send past the credit we granted
        self._send, self._recv = trio.open_memory_channel[Received](math.inf)
        self._queued = 0

    def grant(self) -> None:
        """Top the link's credit up to ``credit`` minus what waits unconsumed."""
        if self.detached is None:
            self.conn.flow(self.link, self.credit - self._queued)

    async def receive(self) -> Received:
        try:
            item = await self._recv.receive()
        except trio.EndOfChannel:
            self.check_usable()
            raise LinkDetachedError(f"link {self.link.name!r} is gone") from None
        self._queued -= 1
        if self.link.link_credit + self._queued <= self.credit // 2:
            self.grant()
        return item

    def settle(self, received: Received, state: Any) -> None:
        """Declare the outcome (Accepted(), Rejected(...)...) of a received message."""
        self.conn.settle(received.delivery, state)

    def on_message(self, delivery: Delivery, payload: bytes) -> None:
        try:
            message = Message.decode(payload)
        except DecodeError as exc:  # refuse it, keep the link: the next one may be fine
            self.conn.settle(
                delivery,
                Rejected(error=Error(condition=conditions.DECODE_ERROR, description=str(exc))),
            )
            self.conn.log.warning("message.undecodable", link=self.link.name, error=str(exc))
            if self.link.link_credit + self._queued <= self.credit // 2:
                self.grant()
            return
        self._queued += 1
        self._send.send_nowait(Received(message, delivery, payload))

    def on_ended(self) -> None:
        self._send.close()

    def __aiter__(self) -> AsyncIterator[Received]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Received]:
        while True:
            try:
                yield await self.receive()
            except (ConnectionLostError, LinkDetachedError):
                return
