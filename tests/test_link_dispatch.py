"""A link's events reach the owner of its end straight from the connection's dispatch table:
the table's entry for the event calls the owner's handler, with nothing in between (there were
two relay layers once), over real TCP on 127.0.0.1."""

from __future__ import annotations

import sys

import trio

from pairlink._amqp.events import DeliveryUpdated, LinkAttached, LinkFlow, MessageReceived
from pairlink._amqp.link import Delivery, Link
from pairlink._amqp.messaging import Accepted, Message, Source, Target
from pairlink._amqp.performatives import ROLE_SENDER
from pairlink._io import connection
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import LinkEnd, LinkOwner, accept, attach
from pairlink._io.listener import listen
from pairlink._io.net import connect
from tests.listening import answering


class Callers(LinkOwner):
    """An owner that notes, for each hook, the two functions that called it."""

    def __init__(self) -> None:
        self.callers: dict[str, tuple[str, str]] = {}
        self.flowed = trio.Event()
        self.done = trio.Event()  # a message arrived, or the outcome of ours did

    def _note(self, hook: str) -> None:
        table_entry, dispatch = sys._getframe(2).f_code, sys._getframe(3).f_code
        self.callers.setdefault(hook, (table_entry.co_qualname, dispatch.co_qualname))

    def link_attached(self, end: LinkEnd) -> None:
        self._note("link_attached")

    def link_flowed(self, end: LinkEnd) -> None:
        self._note("link_flowed")
        self.flowed.set()

    def link_received(self, end: LinkEnd, delivery: Delivery, payload: bytes) -> None:
        self._note("link_received")
        end.conn.settle(delivery, Accepted())
        self.done.set()

    def link_updated(self, end: LinkEnd, delivery: Delivery) -> None:
        self._note("link_updated")
        self.done.set()


def _from_table(event: type) -> tuple[str, str]:
    return (connection._HANDLERS[event].__qualname__, AmqpConnection.dispatch.__qualname__)


async def test_link_events_reach_their_owner_straight_from_the_dispatch_table() -> None:
    ours, theirs = Callers(), Callers()

    def on_attach(conn: AmqpConnection, link: Link) -> None:
        accept(conn, link, theirs)
        conn.flow(link, 10)

    async with (
        listen("amqp://127.0.0.1:0", accept=answering(on_attach)) as listener,
        connect(listener.url) as conn,
    ):
        end = attach(
            conn, ours, role=ROLE_SENDER, name="direct", source=Source(), target=Target("q")
        )
        with trio.fail_after(10):
            await ours.flowed.wait()
            conn.send(end.link, Message(body="hello").encode(), settled=False)
            await theirs.done.wait()
            await ours.done.wait()
    assert ours.callers == {
        "link_attached": _from_table(LinkAttached),
        "link_flowed": _from_table(LinkFlow),
        "link_updated": _from_table(DeliveryUpdated),
    }
    assert theirs.callers == {"link_received": _from_table(MessageReceived)}
