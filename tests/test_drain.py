"""Drain (Part 2 §2.6.7): a receiver that sets ``drain`` gets a flow back from a sender with
nothing to send, advancing delivery-count by the credit and zeroing it (issue 9 §6)."""

from __future__ import annotations

import trio

from pairlink import handler, open_server, service
from pairlink._amqp.link import Link
from pairlink._amqp.performatives import Flow
from pairlink._io.connection import AmqpConnection
from pairlink._io.links import LinkEnd, LinkOwner, accept, open_sender
from pairlink._io.listener import listen
from pairlink._io.net import connect
from tests.listening import answering
from tests.service_peers import raw_client


@service("quiet")
class Quiet:
    @handler
    async def echo(self, x: object) -> object:
        return x


async def test_a_service_answers_a_drain_on_its_reply_link() -> None:
    async with open_server(Quiet, listen="amqp://127.0.0.1:0") as server:
        async with raw_client(server.url) as client:
            sender, receiver = client.pair("quiet", reply_credit=10)
            mid, _ = client.request(sender, "echo", "one")
            await client.wait_reply(mid)  # one reply used one credit of the 10
            client.engine.flow(receiver, 9, drain=True)
            handle = client.link_frames("pair", False)[0].handle  # the service's reply sender

            def drained() -> list[Flow]:
                return [
                    f
                    for f in client.of(Flow, handle=handle)
                    if f.link_credit == 0 and f.delivery_count == 10
                ]

            await client.read_until(lambda: bool(drained()))
        assert receiver.link_credit == 0


class FlowWatch(LinkOwner):
    """Owns a receiving end and tells the test about each flow the sender sends."""

    def __init__(self, conn: AmqpConnection, link: Link) -> None:
        self.flowed = trio.Event()
        self.end = accept(conn, link, self)

    def link_flowed(self, end: LinkEnd) -> None:
        self.flowed.set()


async def test_our_sender_answers_a_drain_when_nothing_waits_to_be_sent() -> None:
    watches: list[FlowWatch] = []

    def on_attach(conn: AmqpConnection, link: Link) -> None:
        watches.append(FlowWatch(conn, link))
        conn.flow(link, 5, drain=True)

    async with (
        listen("amqp://127.0.0.1:0", accept=answering(on_attach)) as listener,
        connect(listener.url) as conn,
    ):
        sender = open_sender(conn, "sink")
        with trio.fail_after(10):
            await sender.attached.wait()
            await watches[0].flowed.wait()
        link = watches[0].end.link
        assert (link.link_credit, link.delivery_count) == (0, 5)
        assert sender.link.link_credit == 0
