"""Our AMQP engine against a real RabbitMQ (3.10, its AMQP 1.0 plugin): the groundwork of
calls through a broker queue (issue 25). Messages sent to a queue come back from it whole,
body, properties and application-properties, each delivery settled as the broker says; what
RabbitMQ 3.10 cannot do (a dynamic reply node) is refused with its own condition, not hung."""

from __future__ import annotations

import uuid

import pytest
import trio

from pairlink import connect as connect_client
from pairlink._amqp.messaging import Accepted, Message, Properties
from pairlink._io.links import open_receiver, open_sender
from pairlink._io.net import connect
from pairlink.errors import LinkDetachedError
from tests.brokers.rabbitmq import Broker

pytestmark = pytest.mark.timeout(120)


async def test_messages_sent_to_a_queue_come_back_whole(broker: Broker) -> None:
    queue = f"/queue/pairlink-{uuid.uuid4().hex[:8]}"
    async with connect(broker.url) as conn:
        sender = open_sender(conn, queue)
        for n in range(3):
            message = Message(
                properties=Properties(message_id=f"m{n}", reply_to="/queue/replies"),
                application_properties={"operation": "echo", "n": n},
                body=f"row {n}".encode(),
                body_kind="data",
            )
            delivery = await sender.send(message)
            assert isinstance(delivery.remote_state, Accepted)
        receiver = open_receiver(conn, queue, credit=10)
        got = []
        with trio.fail_after(10):
            for _ in range(3):
                item = await receiver.receive()
                got.append(item.message)
                receiver.settle(item, Accepted())
    assert [m.body for m in got] == [b"row 0", b"row 1", b"row 2"]
    assert [m.properties.message_id for m in got if m.properties] == ["m0", "m1", "m2"]
    assert [m.properties.reply_to for m in got if m.properties] == ["/queue/replies"] * 3
    assert [(m.application_properties or {}).get("n") for m in got] == [0, 1, 2]


async def test_a_call_needing_a_dynamic_reply_node_is_refused_in_rabbitmqs_words(
    broker: Broker,
) -> None:
    """What a named reply address (``connect(url, reply_address=...)``) is for: RabbitMQ 3.10
    creates no dynamic node, and says so at once."""
    async with connect_client(broker.url, timeout=10) as client:
        with pytest.raises(LinkDetachedError, match="Dynamic sources not supported"):
            await client.call("/queue/rpc", "echo", "hi")
